//! dlock-client (to be filled).
