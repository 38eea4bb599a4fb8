# The README's commands. Each one sets up .venv first (idempotent, see scripts/bootstrap).
.PHONY: bootstrap serve generate test lint bench

bootstrap:
	@scripts/bootstrap

serve: bootstrap
	.venv/bin/cloister serve $(ARGS)

generate: bootstrap
	.venv/bin/cloister generate $(ARGS)

test: bootstrap
	scripts/test

lint: bootstrap
	.venv/bin/ruff check engine tenancy platform tests bench
