"""The soak's handlers and its movable clock (bench/soak.py)."""
