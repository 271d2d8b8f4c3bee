"""Where a job runs: its device (devices), its GPU slots (gpu_slots), one trainer per run (run_lock), and the
launcher that places a stage on its GPUs and restarts it as torchrun ranks (launch)."""
