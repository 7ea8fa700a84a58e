"""Sweeps: many fleet runs (cells) on every core or on a Ray cluster, summed up over seeds.

`cell` describes one run as picklable data and runs it; `runner` runs many, in this process or on a
pool of worker processes, `ray_runner` on a Ray cluster; `stats` gives means and 95% intervals over
seeds and the paired noise test; `figures` names what is compared; `aggregate` sums the runs up per
point of the grid, with the best policy per point and the flips; `grid` reads a grid file; `show`
and `plot` print and draw the result. docs/simulator.md, "Sweeps".
"""
