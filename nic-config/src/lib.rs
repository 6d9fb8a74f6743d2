//! Interface setup for xlb.
