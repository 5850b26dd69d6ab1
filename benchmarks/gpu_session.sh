#!/usr/bin/env bash
# One lent GPU session (15 minutes of device time, the machine's start included), prepared here:
#
#   benchmarks/gpu_session.sh wheels    # HERE, with a package registry: .gpu-site.tar.xz, the Python packages the GPU
#                                       # image lacks (Ray, MLflow, datasets, pydantic, ...), for Python 3.12
#                                       # (git-ignored; `check` tries it here first)
#   benchmarks/gpu_session.sh check     # HERE: the tarball in a Python 3.12 beside the image's packages, the packed
#                                       # study's smoke run through it (no device time spent on a missing package)
#   benchmarks/gpu_session.sh packed    # THERE, first (at most 8.5 minutes): the packed study at 16, 1, 4 and 8
#                                       # cells per GPU
#   benchmarks/gpu_session.sh compiled  # THERE, at once after it (at most 4.5 minutes): the compiled `ablate run`
#                                       # against the loop
#   benchmarks/gpu_session.sh measure   # THERE: the kernel sections (attention decoder additive encoder run_vs_loop)
#   benchmarks/gpu_session.sh profile   # THERE (at most 2.5 minutes): where the decoder's and additive's time goes
#   benchmarks/gpu_session.sh resume    # THERE, at once: the sections the last call left
#   benchmarks/gpu_session.sh repeats   # THERE (at most 8 minutes): both `ablate run` rows again, five repeats each
#   benchmarks/gpu_session.sh test      # THERE (at most 3 minutes): the CUDA tests of every training combination
#
# With the device tool, each call carrying .gpu-site.tar.xz and issued within the machine's 30 s of warmth: packed
# (timeout_s=510), then compiled (timeout_s=280). Each copies into $OUT benchmarks/README.md (its GPU section
# replaced), results/gpu.json, gpu.md and the logs: copy gpu.json back here before the next call, which continues it.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-session}
mkdir -p "$OUT"
PY=${PYTHON:-python3}

setup() {  # the packages the image lacks, first on the path
    if [ -f .gpu-site.tar.xz ]; then
        mkdir -p /tmp/gpu-site && tar -xJf .gpu-site.tar.xz -C /tmp/gpu-site
        export PYTHONPATH=/tmp/gpu-site${PYTHONPATH:+:$PYTHONPATH}
    fi
    export RAY_USAGE_STATS_ENABLED=0 MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/device.txt" 2>&1
    $PY -c "import torch, lightning, mlflow, datasets, pydantic; print(torch.__version__, torch.cuda.get_device_name())" \
        >> "$OUT/device.txt" 2>&1
}

keep() {
    cp benchmarks/README.md benchmarks/results/gpu.json benchmarks/results/gpu.md "$OUT/" 2>/dev/null
}

case "${1:-}" in
wheels)
    site=$(mktemp -d)
    ${PIP:-.venv/bin/python -m pip} install --quiet --target "$site" --python-version 3.12 --implementation cp \
        --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 --only-binary=:all: -c constraints.txt \
        mlflow datasets pydantic tenacity 'ray[tune]' optuna
    # what the image already holds (KINDS.md, read 2026-11-17) stays out: its builds match its torch and numpy; and
    # what only an MLflow server uses (none runs there)
    for dist in numpy pandas pyarrow scipy torch triton networkx sympy mpmath jinja2 markupsafe filelock fsspec \
        requests urllib3 idna certifi charset_normalizer packaging yaml _yaml pyyaml tqdm matplotlib mpl_toolkits \
        pylab contourpy cycler fontTools fonttools kiwisolver pillow PIL pyparsing dateutil python_dateutil six \
        click werkzeug protobuf google aiohttp aiosignal frozenlist multidict yarl propcache attrs \
        huggingface_hub hf_xet xxhash cloudpickle typing_extensions psutil sklearn scikit_learn joblib \
        threadpoolctl narwhals skops huey gunicorn graphene graphql graphql_relay uvicorn docker share; do
        rm -rf "$site/$dist" "$site/$dist.py" "$site/$dist.libs" "$site/$dist"-*.dist-info \
            "$site/${dist//_/-}"-*.dist-info
    done
    rm -rf "$site"/numpy.libs "$site"/scipy.libs "$site"/pillow.libs "$site"/mlflow/server/js "$site"/bin \
        "$site"/__pycache__
    # what a local Ray with Tune never loads: Java, RLlib, Serve, the LLM libraries, the dashboard's web client
    rm -rf "$site"/ray/jars "$site"/ray/rllib "$site"/ray/serve "$site"/ray/llm "$site"/ray/dashboard/client
    # and what neither a local Ray nor MLflow's SQL store imports; Ray's binaries without their symbol tables: the
    # working tree that travels holds 64 MiB in all (this tarball about 49 MB of it)
    for dist in git gitdb smmap gitpython flask flask_cors blinker itsdangerous pyasn1 pyasn1_modules; do
        rm -rf "$site/$dist" "$site/$dist"-*.dist-info
    done
    rm -rf "$site"/sqlalchemy/testing "$site"/mlflow/assistant
    strip --strip-unneeded "$site"/ray/_raylet.so "$site"/ray/core/src/ray/gcs/gcs_server \
        "$site"/ray/core/src/ray/raylet/raylet
    tar -cf - -C "$site" . | xz -T2 -9e > .gpu-site.tar.xz && rm -rf "$site"
    ls -la .gpu-site.tar.xz
    ;;
check)  # here: a Python 3.12 like the image's (its packages from constraints.txt), the tarball first on the path
    venv=${CHECK_VENV:-/tmp/gpu-check-venv}
    py312=${PYTHON312:-}
    for candidate in $(ls "$HOME"/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null) python3.12; do
        [ -z "$py312" ] && "$candidate" -c "" 2>/dev/null && py312=$candidate
    done
    [ -n "$py312" ] || { echo "check needs a Python 3.12 (PYTHON312=...)"; exit 2; }
    if [ ! -x "$venv/bin/python" ]; then
        "$py312" -m venv "$venv" && "$venv/bin/python" -m pip install --quiet -c constraints.txt torch lightning \
            numpy pandas pyarrow scipy statsmodels pyyaml matplotlib plotly requests filelock fsspec jinja2 \
            huggingface_hub xxhash tqdm psutil click aiohttp cloudpickle packaging protobuf msgpack grpcio || exit 1
    fi
    rm -rf /tmp/gpu-check-site && mkdir -p /tmp/gpu-check-site && tar -xJf .gpu-site.tar.xz -C /tmp/gpu-check-site
    PYTHONPATH=/tmp/gpu-check-site RAY_USAGE_STATS_ENABLED=0 "$venv/bin/python" benchmarks/gpu.py --smoke \
        --only packed profile --compiler aot_eager --out /tmp/gpu-check
    ;;
packed)  # continues the committed gpu.json: the other sections keep their figures (each names its date)
    setup
    ABLATE_PACKING_LOGS="$OUT/packed-sweeps.log" timeout 480 $PY benchmarks/gpu.py --only packed > "$OUT/gpu.log" 2>&1
    echo "exit $?" >> "$OUT/gpu.log"
    keep
    ;;
compiled)  # the same machine: benchmarks/results/gpu.json is the first call's
    setup
    timeout 250 $PY benchmarks/gpu.py --only run_vs_loop_compiled --limits run_vs_loop_compiled=225 \
        > "$OUT/gpu-compiled.log" 2>&1
    echo "exit $?" >> "$OUT/gpu-compiled.log"
    keep
    ;;
profile)
    setup
    timeout 130 $PY benchmarks/gpu.py --only profile > "$OUT/gpu-profile.log" 2>&1
    echo "exit $?" >> "$OUT/gpu-profile.log"
    keep
    ;;
measure)
    setup
    rm -f benchmarks/results/gpu.json  # a new measurement: the committed one is not continued
    timeout 540 $PY benchmarks/gpu.py --only attention decoder additive encoder run_vs_loop > "$OUT/gpu.log" 2>&1
    echo "exit $?" >> "$OUT/gpu.log"
    keep
    ;;
resume)  # the same machine: benchmarks/results/gpu.json is the first call's
    setup
    timeout 310 $PY benchmarks/gpu.py --resume > "$OUT/gpu-resume.log" 2>&1
    echo "exit $?" >> "$OUT/gpu-resume.log"
    keep
    ;;
repeats)  # continues the committed gpu.json: the other sections keep their figures
    setup
    timeout 470 $PY benchmarks/gpu.py --only run_vs_loop,run_vs_loop_compiled > "$OUT/gpu.log" 2>&1
    echo "exit $?" >> "$OUT/gpu.log"
    keep
    ;;
test)
    setup
    timeout 170 $PY -m pytest -q -m cuda -p no:randomly --durations=0 tests/ablations/test_train.py tests/models \
        > "$OUT/cuda-tests.log" 2>&1
    echo "exit $?" >> "$OUT/cuda-tests.log"
    ;;
*)
    sed -n "2,/^set -u/{/^set -u/!p}" "$0"
    exit 2
    ;;
esac
