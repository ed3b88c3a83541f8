//! `marshd`: the stand-in per-home daemon, its in-sandbox agent and kit client.

fn main() {
    std::process::exit(marsh_linux_backend::marshd_main(
        std::env::args_os().collect(),
    ));
}
