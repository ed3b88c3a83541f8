//! `sbx`: the stand-in sandbox CLI (see marsh-shim/README.md).

fn main() {
    std::process::exit(marsh_shim::sbx_main());
}
