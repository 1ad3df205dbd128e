"""The one hashing pool: crc32c and the incremental save's digests share bounded, named threads."""

from __future__ import annotations

import os
import sys
import threading

import numpy as np
import pytest

from trackpoint.bundle import crc, threads
from trackpoint.saving import change_tracking


def _hashing_threads() -> set[str]:
    return {
        t.name
        for t in threading.enumerate()
        if t.name.startswith(("trackpoint-hash", "trackpoint-crc"))
    }


def test_crc_and_digests_hash_on_one_bounded_pool() -> None:
    futures = [crc.crc32c_in_background(np.zeros(1 << 20)) for _ in range(3 * threads.MAX_THREADS)]
    arrays = [np.zeros(2 << 20), np.ones(2 << 20)]  # 32 MiB: hashed on several threads
    digests = change_tracking.content_digests(arrays)
    assert digests == [change_tracking.content_digest(a) for a in arrays]
    assert len({future.result(timeout=30) for future in futures}) == 1
    names = _hashing_threads()
    assert names, "nothing hashed on a helper thread"
    assert all(name.startswith("trackpoint-hash") for name in names), names  # no second pool
    assert len(names) <= threads.MAX_THREADS


def test_crc_in_background_equals_crc_now() -> None:
    data = np.arange(1 << 20, dtype=np.uint8)
    assert crc.crc32c_in_background(data, 7).result(timeout=30) == crc.extend(7, data)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_hashes_on_a_pool_of_its_own() -> None:
    # The parent's pool has threads (and an idle one): a forked child that handed work to the
    # same pool would wait forever, since the executor thinks an idle thread will take it.
    crc.crc32c_in_background(b"warm").result(timeout=30)
    change_tracking.content_digests([np.zeros(1 << 20)])
    pid = os.fork()
    if pid == 0:  # the child: report through the exit status only
        code = 1
        try:
            data = np.arange(1 << 16, dtype=np.uint8)
            if crc.crc32c_in_background(data).result(timeout=20) == crc.crc32c(data):
                code = 0
        except BaseException:  # noqa: S110 - any failure is the exit status
            code = 2
        finally:
            sys.stdout.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
