//! The `durable` binary. Everything is in the library crate (`durable_cli`): see its docs.

fn main() -> std::process::ExitCode {
    durable_cli::main()
}
