"""A real TransferQueue (on a local Ray) for the tests that read and write verl's V1 batches."""

from __future__ import annotations

import pytest
import ray
import transfer_queue as tq


@pytest.fixture(scope="module")
def transfer_queue():
    # Ray counts CPUs as slots; TransferQueue's controller and storage units need more than 2
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    tq.init()
    yield tq
    tq.close()
    ray.shutdown()
