"""slurmrestd-compatible routes (`/slurm/v0.0.40/` .. `/slurm/v0.0.42/`), for the tools
written against Slurm's REST API (docs/architecture.md, "slurmrestd").

- `envelope`: the versions served, `meta`, and errors and warnings in slurmrestd's shape.
- `auth`: the API token as `X-SLURM-USER-TOKEN` (+ `X-SLURM-USER-NAME`) or `Bearer`.
- `jobdesc`: Slurm's job description (`job_desc_msg`) -> our JobSpec dict, in one place.
- `jobinfo`: our job object -> Slurm's `job_info`, in one place.
- `cluster`: nodes, partitions, ping and diag in Slurm's shapes.
- `views`, `urls`: thin views over jobs.services and jobs.selectors.
"""
