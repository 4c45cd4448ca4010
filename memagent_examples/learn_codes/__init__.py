"""The password task the CPU main job learns (`recipes/cpu/learn_codes.sh`, docs/main_job.md)."""
