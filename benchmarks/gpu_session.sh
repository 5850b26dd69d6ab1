#!/usr/bin/env bash
# One lent GPU session (15 minutes of device time, the machine's start included), prepared here:
#
#   benchmarks/gpu_session.sh wheels    # HERE, with a package registry: .gpu-site.tar.xz, the Python packages the GPU
#                                       # image lacks (mlflow, datasets, pydantic, ...), for Python 3.12 (git-ignored)
#   benchmarks/gpu_session.sh measure   # THERE, first (at most 9 minutes): every section but the compiled run_vs_loop
#   benchmarks/gpu_session.sh resume    # THERE, at once (at most 5.2 minutes): the sections the first call left
#   benchmarks/gpu_session.sh repeats   # THERE (at most 8 minutes): both `ablate run` rows again, five repeats each
#   benchmarks/gpu_session.sh test      # THERE (at most 3 minutes): the CUDA tests of every training combination
#
# With the device tool, each call carrying .gpu-site.tar.xz and issued within the machine's 30 s of warmth. Every
# section: measure (timeout_s=570), then resume (timeout_s=330), more than one lease's 15 minutes with its start: in
# two leases, or as the 2026-11-28 lease did, repeats (timeout_s=490) then test (timeout_s=190) where the other
# sections' figures stand. Each copies into $OUT benchmarks/README.md (its GPU section replaced), results/gpu.json,
# gpu.md and the logs: copy gpu.json back here before the next call, which continues it.
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
        mlflow datasets pydantic tenacity
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
    tar -cJf .gpu-site.tar.xz -C "$site" . && rm -rf "$site"
    ls -la .gpu-site.tar.xz
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
