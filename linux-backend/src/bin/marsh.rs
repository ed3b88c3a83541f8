//! `marsh`: the stand-in marsh CLI (its contract: docs/linux-backend.md).

fn main() {
    std::process::exit(marsh_linux_backend::marsh_main());
}
