"""Whole trajectories as readable records: one JSON line per trajectory, tracker tables and an HTML page.

`schema` is the record (and the `turn_log` the agent loops write into `extra_fields`), `build` makes
records from an agent loop's outputs, `files` writes and reads `trajectories/*.jsonl`, `table` renders
them for a tracker, `report` writes the page that `verl-memagent show` opens (docs/trajectories.md).
Nothing is imported here: the agent loops import `schema` alone.
"""
