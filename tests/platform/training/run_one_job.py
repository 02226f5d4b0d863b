"""`python run_one_job.py JOB_ID MODEL_DIR`: the task body of a training worker (runner.run_job) for
one job, alone in a process a test can SIGKILL mid-run. Settings come from LORALOOM_* variables."""
from __future__ import annotations

import sys
from pathlib import Path

from loraloom.engine import EngineConfig
from loraloom.platform.settings import Settings
from loraloom.platform.training.runner import WorkerContext, run_job


def main(job_id: str, model_dir: str) -> None:
    run_job(job_id, WorkerContext(settings=Settings(), model_dir=Path(model_dir),
                                  max_lora_rank=EngineConfig().max_lora_rank, worker_id="doomed-worker",
                                  send=lambda _: None))


if __name__ == "__main__":
    main(*sys.argv[1:])
