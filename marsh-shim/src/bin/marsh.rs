//! `marsh`: the stand-in marsh CLI (see marsh-shim/README.md).

fn main() {
    std::process::exit(marsh_shim::marsh_main());
}
