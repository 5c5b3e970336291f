"""The trial's life in a small JSON file in the trial dir, replaced atomically.

Readers (cleanup.sh, the local platform, a person) never see half a file: each
update is written to a temporary file and renamed over the old one.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Dict, Optional


class StatusFile:
    def __init__(self, path: Path):
        self.path = path
        self.data: Dict[str, Any] = {"history": []}

    @staticmethod
    def previous(path: Path) -> Optional[Dict[str, Any]]:
        """What an earlier keeper on this trial dir left, if anything readable."""
        try:
            with open(path, encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def update(self, status: Optional[str] = None, **fields: Any) -> None:
        self.data.update(fields)
        if status is not None:
            self.data["status"] = status
            self.data["history"].append({"status": status, "time": time.time()})
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as f:  # one write: this is on the keeper's way out
            f.write(json.dumps(self.data).encode())
        os.replace(tmp, self.path)
