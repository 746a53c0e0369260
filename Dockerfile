# syntax=docker/dockerfile:1.7
#
# embedstream image: the `embedstream` CLI and workers, with the offline model weights
# (requirements-models.txt) baked in. Non-root, no network needed at run time.
#
# Build from the repository root (BuildKit is required: it is the default builder of Docker 23+):
#
#   CPU (default; python:3.11-slim + CPU-only torch from the PyTorch CPU index, several GB smaller
#   than the CUDA wheels):
#     docker build -t embedstream:cpu .
#
#   NVIDIA GPU (nvidia/cuda runtime base + Python 3.11 + the default PyPI torch, a CUDA build):
#     docker build -t embedstream:cuda --build-arg VARIANT=cuda .
#
#   NVIDIA GPU + flash-attn (the `gpu` extra; compiled with nvcc when no prebuilt wheel matches
#   torch/CUDA/Python, which takes a long time and a lot of RAM; MAX_JOBS caps the compile jobs):
#     docker build -t embedstream:cuda --build-arg VARIANT=cuda --build-arg INSTALL_FLASH_ATTN=1 .
#
# Build args:
#   VARIANT            cpu (default) | cuda
#   TORCH_INDEX_URL    index torch is installed from. Empty (default) means: the PyTorch CPU index
#                      (https://download.pytorch.org/whl/cpu) for VARIANT=cpu, PyPI for VARIANT=cuda.
#                      E.g. https://download.pytorch.org/whl/cu128 picks a specific CUDA build.
#   CUDA_VERSION       nvidia/cuda tag for VARIANT=cuda (default 12.8.1). torch wheels bundle their
#                      own CUDA libraries, so this mostly matters for flash-attn's nvcc build: keep
#                      its major version equal to `python -c "import torch; print(torch.version.cuda)"`.
#   INSTALL_FLASH_ATTN 0 (default) | 1, only with VARIANT=cuda
#   MAX_JOBS           parallel compile jobs for flash-attn (default 4)
#   INSTALL_OPENVINO   0 (default) | 1: the OpenVINO CPU backend (extra "openvino"; bulk workers
#                      at 2+ threads or int8: EMBEDSTREAM_ENGINE__BACKEND=openvino)
#   PYTHON_IMAGE       Python base of VARIANT=cpu (default python:3.11-slim-bookworm; `embedstream dev
#                      images build` makes a Debian-built one under that name where no registry answers)
#   WHEELHOUSE_IMAGE   an image whose /wheels holds every wheel the build installs (`embedstream dev images
#                      build wheelhouse`, from PyPI): pip then uses no package index at all, so the build
#                      needs no network (an air-gapped site, or one that cannot reach the PyTorch index).
#                      The wheelhouse holds PyPI's torch, the CUDA build (+ its nvidia-* wheels): it serves
#                      both variants. Default: none, the indexes above.
#
# Run:
#   docker run --rm embedstream:cpu --help
#   docker run --rm -i embedstream:cpu embed < texts.jsonl > vectors.jsonl
#   docker run -d -p 9400:9400 -e EMBEDSTREAM_KAFKA__BOOTSTRAP_SERVERS=kafka:9092 \
#       -e EMBEDSTREAM_QDRANT__URL=http://qdrant:6333 embedstream:cpu \
#       worker embed --lanes online --metrics-port 9400
#   docker run --gpus all ... embedstream:cuda worker embed --lanes bulk
# Settings are EMBEDSTREAM_* variables (see embedstream/config.py); the stack in
# docker-compose.yml wires them (see compose/README.md).
#
# The HEALTHCHECK polls http://127.0.0.1:${HEALTHCHECK_PORT:-9400}/healthz, served by the
# `worker` commands; set HEALTHCHECK_PORT when a worker runs with another --metrics-port.
# One-shot CLI runs (embed, score, --help) serve nothing and simply exit before it matters.

ARG VARIANT=cpu
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG CUDA_VERSION=12.8.1
ARG WHEELHOUSE_IMAGE=wheelhouse-none

# ---------------------------------------------------------------------------------------------
# The wheels pip installs from: an empty /wheels (the package indexes) unless WHEELHOUSE_IMAGE names
# an image that holds them. Mounted into the builder's pip steps, never copied into an image.
# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS wheelhouse-none
RUN mkdir -p /wheels

FROM ${WHEELHOUSE_IMAGE} AS wheelhouse

# ---------------------------------------------------------------------------------------------
# Python bases. Builder and runtime of one variant share the interpreter path, so the virtual
# environment built in one can be copied into the other.
# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS python-cpu

# Ubuntu 22.04 ships python3.11 (3.11.0, jammy-updates); the builder below uses the same package.
FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu22.04 AS python-cuda
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.11 ca-certificates \
    && rm -rf /var/lib/apt/lists/*

# ---------------------------------------------------------------------------------------------
# Builders: one per variant; only the one named by VARIANT is built.
# ---------------------------------------------------------------------------------------------
FROM python-cpu AS builder-cpu
ENV TORCH_INDEX_URL_DEFAULT=https://download.pytorch.org/whl/cpu

# The devel image brings nvcc, which flash-attn needs when it has to compile.
FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu22.04 AS builder-cuda
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        python3.11 python3.11-venv python3.11-dev build-essential ca-certificates \
    && rm -rf /var/lib/apt/lists/*
ENV TORCH_INDEX_URL_DEFAULT=https://pypi.org/simple

FROM builder-${VARIANT} AS builder
ARG VARIANT
ARG TORCH_INDEX_URL=""
ARG INSTALL_FLASH_ATTN=0
ARG MAX_JOBS=4
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

RUN --mount=type=cache,target=/root/.cache/pip --mount=type=bind,from=wheelhouse,source=/wheels,target=/wheels \
    export PIP_FIND_LINKS=/wheels; if [ -n "$(ls -A /wheels)" ]; then export PIP_NO_INDEX=1; fi; \
    python3.11 -m venv /opt/venv \
    && pip install --upgrade pip setuptools wheel

WORKDIR /src

# 1) Dependencies only (cached until pyproject.toml or requirements-models.txt change):
#    torch first, from TORCH_INDEX_URL; then the remaining pins from PyPI. A CPU wheel's
#    version "X+cpu" satisfies the "torch==X" pin, so pip keeps it.
COPY pyproject.toml requirements-models.txt ./
RUN --mount=type=cache,target=/root/.cache/pip --mount=type=bind,from=wheelhouse,source=/wheels,target=/wheels \
    set -eu; \
    export PIP_FIND_LINKS=/wheels; if [ -n "$(ls -A /wheels)" ]; then export PIP_NO_INDEX=1; fi; \
    python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt; \
    torch_pin="$(grep -E '^torch([<>=!~ ]|$)' /tmp/requirements.txt)"; \
    pip install --index-url "${TORCH_INDEX_URL:-$TORCH_INDEX_URL_DEFAULT}" "$torch_pin"; \
    pip install -r /tmp/requirements.txt; \
    pip install --no-deps -r requirements-models.txt

# 2) Optional flash-attn (extra "gpu"), before the source so a code change does not recompile it.
RUN --mount=type=cache,target=/root/.cache/pip \
    set -eu; \
    if [ "$INSTALL_FLASH_ATTN" = "1" ]; then \
        if [ "$VARIANT" != "cuda" ]; then echo "INSTALL_FLASH_ATTN=1 needs VARIANT=cuda" >&2; exit 1; fi; \
        pip install packaging ninja psutil; \
        python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['gpu']))" \
            > /tmp/requirements-gpu.txt; \
        MAX_JOBS="$MAX_JOBS" pip install --no-build-isolation -r /tmp/requirements-gpu.txt; \
    fi

# 2b) Optional OpenVINO CPU backend (extra "openvino": EMBEDSTREAM_ENGINE__BACKEND=openvino).
ARG INSTALL_OPENVINO=0
RUN --mount=type=cache,target=/root/.cache/pip \
    set -eu; \
    if [ "$INSTALL_OPENVINO" = "1" ]; then \
        python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['openvino']))" \
            > /tmp/requirements-openvino.txt; \
        pip install -r /tmp/requirements-openvino.txt; \
    fi

# The package itself is installed in the runtime stage (3) below: the dependencies' venv (GBs with torch)
# stays one cached layer there, and a change of the project's code rebuilds only a small one.

# ---------------------------------------------------------------------------------------------
# Runtime
# ---------------------------------------------------------------------------------------------
FROM python-${VARIANT} AS runtime

LABEL org.opencontainers.image.title="embedstream" \
      org.opencontainers.image.description="Streaming, Kafka-driven embedding and reranking workers" \
      org.opencontainers.image.licenses="Apache-2.0"

ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    HF_HUB_DISABLE_TELEMETRY=1 \
    HOME=/home/embedstream \
    HEALTHCHECK_PORT=9400

RUN groupadd --system --gid 10001 embedstream \
    && useradd --system --uid 10001 --gid embedstream --create-home --home-dir /home/embedstream \
        --shell /usr/sbin/nologin embedstream \
    && mkdir -p /app \
    && chown embedstream:embedstream /app

COPY --from=builder /opt/venv /opt/venv

# 3) The package itself, on the dependencies already in place (the build backend, setuptools, is in the venv
#    from step 1: no index needed). Only this layer changes with the project's code.
COPY . /tmp/src
RUN cd /tmp/src && pip install --no-deps --no-build-isolation --no-cache-dir . \
    && cd / && rm -rf /tmp/src && embedstream --help > /dev/null

WORKDIR /app
USER 10001:10001

# Worker metrics and health: /metrics, /healthz, /readyz (--metrics-port, default 9400).
EXPOSE 9400

HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('HEALTHCHECK_PORT', '9400'), timeout=4)"]

ENTRYPOINT ["embedstream"]
CMD ["--help"]
