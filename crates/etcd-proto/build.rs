//! Compiles `proto/` into tonic clients with protox, a protobuf compiler in Rust, so that
//! building kvlab needs no `protoc` on the machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/etcd/api/mvccpb/kv.proto",
        "proto/etcd/api/etcdserverpb/rpc.proto",
    ];
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(false)
        .build_transport(false)
        .compile_fds(descriptors)?;
    Ok(())
}
