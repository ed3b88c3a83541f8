//! `sbx`: the stand-in sandbox CLI (its contract: docs/sbx-stand-in.md).

fn main() {
    std::process::exit(marsh_linux_backend::sbx_main());
}
