//! Weights I/O.
