"""Fleet simulation: the real scheduler against simulated engines, in virtual time (`epick simulate`)."""
