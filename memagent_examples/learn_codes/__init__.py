"""The password task the CPU learning demo learns (`recipes/cpu/learn_codes.sh`, docs/learn_codes.md)."""
