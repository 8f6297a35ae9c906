"""weightstream_client: submit, follow, cancel and download jobs on a weightstream service.

from weightstream_client import Client
job = Client().submit("params.yaml", num_csx=4)   # WEIGHTSTREAM_URL, WEIGHTSTREAM_TOKEN
job.wait()                                          # progress bar; raises JobFailedError on failure
job.download("./out")
"""

from weightstream_client._client import ApiError, Client, Job, JobFailedError
from weightstream_client._download import CheckpointExistsError

__all__ = ["ApiError", "CheckpointExistsError", "Client", "Job", "JobFailedError"]
__version__ = "0.1.0"
