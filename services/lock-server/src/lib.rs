//! lock-server library (to be filled).
