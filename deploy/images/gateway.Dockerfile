# syntax=docker/dockerfile:1.7
# A Cloister gateway replica (`cloister serve --engine-urls ...`), the admin API and
# console, and the migration Job (`cloister db upgrade`). Build from the repository root:
#   docker build -f deploy/images/gateway.Dockerfile -t cloister-gateway:0.1.0 .
#
# torch stays in, as the CPU build: the gateway's modules import no torch, but its
# tokenizer does at run time for a GGUF model (transformers converts the GGUF's
# vocabulary through its torch-backed GGUF reader), and the project declares torch as a
# dependency. Only CPU wheels: no CUDA libraries, no triton.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm
ARG NODE_IMAGE=node:22.12.0-bookworm-slim

FROM ${NODE_IMAGE} AS ui
WORKDIR /app/admin_ui
COPY admin_ui/package.json admin_ui/package-lock.json ./
RUN npm ci --omit=dev --no-audit --no-fund

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
WORKDIR /app
COPY pyproject.toml setup.py README.md alembic.ini ./
COPY engine ./engine
COPY tenancy ./tenancy
COPY platform ./platform
COPY migrations ./migrations
COPY admin_ui ./admin_ui
COPY --from=ui /app/admin_ui/node_modules ./admin_ui/node_modules
RUN pip install -e .

FROM ${PYTHON_IMAGE} AS runtime
RUN groupadd --system --gid 10001 cloister \
 && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --shell /usr/sbin/nologin cloister
COPY --from=build /opt/venv /opt/venv
COPY --from=build --chown=root:root /app /app
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    HOME=/tmp HF_HOME=/tmp/hf XDG_CACHE_HOME=/tmp/cache \
    CLOISTER_DATA_DIR=/var/lib/cloister
RUN install -d -o 10001 -g 10001 -m 0700 /var/lib/cloister
WORKDIR /app
USER 10001:10001
EXPOSE 8000
ENTRYPOINT ["cloister"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
