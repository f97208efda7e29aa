"""The networks: `plan` (the plan format), `layers` (one module per layer
kind, with its kernels and op functions; `conv` holds the conv kind's
techniques), `ops` (the op table), `network` (the compiled passes over a
plan) and `models` (the driver over the kinds, presets, the Model API)."""
