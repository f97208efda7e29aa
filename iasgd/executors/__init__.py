"""Who runs the steps, and how time passes. Siblings, each driving the same
compiled protocol (iasgd.protocol) through the same epoch loop (`epochs`)
and the same executor base (`base`: the record, evaluations, the monitor's
tick, the one-thread BLAS limit):

- `sequential`: one thread, plain mini-batch SGD with momentum;
- `threads`: worker threads of one machine on one shared parameter array;
- `simulated`: n workers on a model of time (`sim_costs`) and cores
  (`sim_events`), one step at a time;
- `cluster` and `ray_cluster`: nodes of threads exchanging updates
  (`exchange`) with a parameter server, as Ray actors (`ray_connect`
  reaches Ray).

`arrays` builds the arrays and bundles that threads and the simulator share.
"""
