//! `sbx`: the stand-in sandbox CLI (its contract: docs/sbx-stand-in.md).

fn main() {
    std::process::exit(sbx_stand_in::main());
}
