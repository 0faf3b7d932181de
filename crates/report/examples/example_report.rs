//! Writes the example report (every item kind) into a directory:
//! `cargo run -p kvlab-report --example example_report -- /tmp/report`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args().nth(1).unwrap_or_else(|| "report".into());
    let files = kvlab_report::write_report(&dir, &kvlab_report::example::example_report())?;
    println!("{}", files.index.display());
    Ok(())
}
