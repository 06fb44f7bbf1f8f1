"""JSON at the edge: the one name for a JSON object as ortcompile writes or reads it.

Results and records are typed (frozen dataclasses) inside the program. A `JsonObject` is only what one of them hands
to `json.dumps` (its `to_json()`), what `json.loads` gave back before a reader checked it into a record, or a
document whose shape is free by contract (ORT provider options, what an EP says about a device).
"""

from __future__ import annotations

from typing import Any

JsonObject = dict[str, Any]  # the one alias: every use is JSON at the edge, never a record's own shape
