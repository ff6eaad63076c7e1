"""`vlmgym compare`: training algorithms from one start policy at a matched budget (command), seeds as an axis
(seeds)."""
