//! The part of etcd's v3 gRPC API that kvlab's topology store uses (`proto/`: the KV,
//! Watch and Lease calls it makes, with etcd's own names and field numbers), as prost
//! messages and tonic clients.
//!
//! The build compiles the `.proto` files with `protox`, a protobuf compiler written in
//! Rust, instead of `protoc`: building kvlab needs nothing but the Rust toolchain. The
//! clients are generic over the channel; `kvlab-cluster` hands them a
//! `tonic::transport::Channel` per etcd member.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

// Generated code: its docs are the .proto files' comments, and not every item has one.

/// etcd's storage types (`mvccpb`): key-values and watch events.
#[allow(missing_docs)]
pub mod mvccpb {
    tonic::include_proto!("mvccpb");
}

/// etcd's server API (`etcdserverpb`): the KV, Watch and Lease services and their messages.
#[allow(missing_docs)]
pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
}
