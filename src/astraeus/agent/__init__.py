"""The machine agent: registers a machine, reconciles its workers with the control plane, ships logs."""
