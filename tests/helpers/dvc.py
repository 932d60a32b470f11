"""A throwaway DVC repository for DVCLive, which logs artifacts only inside one."""

from __future__ import annotations

from pathlib import Path

import pytest


def dvc_workspace(root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Make ``root`` a DVC repository without Git, work in it, and keep DVC offline and inside ``root``.

    DVCLive's ``Live()`` finds the repository from the working folder. Without Git it saves no DVC experiment at
    ``live.end()`` (that part is DVC's, the same under both trainers, and slow).
    """
    monkeypatch.setenv("DO_NOT_TRACK", "1")
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")
    monkeypatch.setenv("DVC_SITE_CACHE_DIR", str(root.parent / f"{root.name}_dvc_site_cache"))
    monkeypatch.setenv("HF_DVCLIVE_LOG_MODEL", "true")
    from dvc.repo import Repo

    root.mkdir(parents=True, exist_ok=True)
    Repo.init(str(root), no_scm=True).close()
    monkeypatch.chdir(root)
    return root
