//! Client side of the protocol: compose requests, parse responses.
