from tests.scheduler.cli.fake_api import fake_api
from tests.scheduler.cli.golden_commands import golden_run
from tests.scheduler.slurm.conftest import utc

__all__ = ["fake_api", "golden_run", "utc"]
