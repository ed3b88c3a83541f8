//! Publication requests from the project shell's agent (`mcp publish|unpublish|load`
//! run by a job). The agent's channel is the authority: kit containers have no agent,
//! and a host `marsh` cannot ask the daemon to publish. One request at a time runs, on
//! its own thread (a transaction may wait for the control lock and for bounded sbx
//! runs); a request meanwhile is answered busy at once. Answers go back on the same
//! channel.

use std::sync::Arc;

use super::{Daemon, Shell};
use crate::proto::{PublicationAnswer, PublicationRequest, ToAgent};

pub(super) fn start(
    daemon: &Arc<Daemon>,
    shell: &Arc<Shell>,
    req: u64,
    request: PublicationRequest,
) {
    let name = request.tool_name().to_string();
    let Some(busy) = daemon.try_publication_guard() else {
        let answer = PublicationAnswer::rejected(
            Some(&name),
            "busy: another publication transaction of this project shell is running; retry",
            false,
        );
        shell.send(&ToAgent::PublicationDone { req, answer });
        return;
    };
    let publisher = daemon.publisher();
    let replier = Arc::clone(shell);
    let spawned = std::thread::Builder::new()
        .name("publication".into())
        .spawn(move || {
            let _busy = busy;
            let answer = publisher.execute(&request);
            replier.send(&ToAgent::PublicationDone { req, answer });
        });
    if let Err(e) = spawned {
        let answer = PublicationAnswer::rejected(
            Some(&name),
            format!("the daemon could not start the transaction: {e}"),
            false,
        );
        shell.send(&ToAgent::PublicationDone { req, answer });
    }
}
