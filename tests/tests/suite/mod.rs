//! One module per black-box suite (formerly one test binary each).

mod backpressure;
mod broker;
mod ergonomics;
mod export;
mod first_run;
mod hardening;
mod host_life;
mod inspector;
mod install_clients;
mod install_sbx;
mod lifecycle;
mod operations;
mod output_schemas;
mod pinning;
mod progress;
mod protocol;
mod publish;
mod published_codex;
mod python_client;
mod replies;
mod sandbox;
mod scopes;
mod sessions;
mod shell_run;
mod shutdown;
mod startup;
