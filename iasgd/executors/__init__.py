"""Who runs the steps, and how time passes. Siblings, each driving the same
compiled protocol (iasgd.protocol) through the same epoch loop (`epochs`):

- `sequential`: one thread, plain mini-batch SGD with momentum;
- `threads`: worker threads of one machine on one shared parameter array;
- `simulated`: n workers on a model of time and cores, one step at a time;
- `cluster` and `ray_cluster`: nodes of threads exchanging updates with a
  parameter server, as Ray actors.

`arrays` builds the arrays and bundles that threads and the simulator share.
"""
