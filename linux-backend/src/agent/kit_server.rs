//! The sandbox-private agent socket. A job's kit wrapper connects, hands over its
//! stdio, and waits; the agent relays the request to the daemon (which starts the
//! kit's fresh container) and relays the outcome back. A wrapper that disappears
//! (its job was cancelled) cancels its kit job. The `mcp` command connects with a
//! publication request, relayed the same way; the daemon finishes a transaction it
//! started even if the command goes away.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use super::Agent;
use crate::kits;
use crate::proto::{
    self, Bytes, EnvVar, FromAgent, KitReply, PublicationAnswer, PublicationRequest, ShellRequest,
};
use crate::seqpacket::{Listener, SeqPacket};
use crate::util::{lock, log};

const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

pub(super) fn serve(agent: &Arc<Agent>, listener: &Listener) {
    loop {
        let conn = match listener.accept() {
            Ok(conn) => conn,
            Err(e) => {
                log!("marshd agent: kit socket: {e}");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let agent = Arc::clone(agent);
        if let Err(e) = std::thread::Builder::new()
            .name("kit-conn".into())
            .spawn(move || handle(&agent, conn))
        {
            log!("marshd agent: starting a kit connection thread: {e}");
        }
    }
}

fn handle(agent: &Arc<Agent>, conn: SeqPacket) {
    let conn = Arc::new(conn);
    if conn.set_recv_timeout(Some(REQUEST_TIMEOUT)).is_err() {
        return;
    }
    match proto::recv::<ShellRequest>(&conn) {
        Ok(Some((ShellRequest::Kit { kit, args, env }, fds))) => {
            if let Some(reply) = relay(agent, &conn, kit, args, env, fds) {
                let _ = proto::send(&conn, &reply, &[]);
            }
        }
        Ok(Some((ShellRequest::Publication { request }, _))) => {
            let answer = relay_publication(agent, request);
            let _ = proto::send(&conn, &answer, &[]);
        }
        Ok(None) => {}
        Err(e) => {
            let message = format!("bad request: {e}");
            let _ = proto::send(&conn, &KitReply::Failed { code: 1, message }, &[]);
        }
    }
    conn.shutdown();
}

/// Hands a publication request to the daemon and waits for its answer.
fn relay_publication(agent: &Arc<Agent>, request: PublicationRequest) -> PublicationAnswer {
    let name = request.tool_name().to_string();
    let req = agent.next_kit_req.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = mpsc::channel();
    lock(&agent.publication_waiters).insert(req, tx);
    if let Err(e) = proto::send(&agent.chan, &FromAgent::Publication { req, request }, &[]) {
        lock(&agent.publication_waiters).remove(&req);
        // A record is sent whole or not at all: nothing reached the daemon.
        return PublicationAnswer::rejected(
            Some(&name),
            format!("relaying the request to the daemon: {e}"),
            false,
        );
    }
    rx.recv().unwrap_or_else(|_| {
        PublicationAnswer::uncertain(
            Some(&name),
            "the project shell shut down before the daemon answered",
        )
    })
}

/// Relays one kit request and answers the wrapper. Returns the reply still to be
/// sent when the request fails before reaching the daemon.
fn relay(
    agent: &Arc<Agent>,
    conn: &Arc<SeqPacket>,
    kit: String,
    args: Vec<Bytes>,
    env: Vec<EnvVar>,
    fds: Vec<std::os::fd::OwnedFd>,
) -> Option<KitReply> {
    let failed = |message: String| Some(KitReply::Failed { code: 1, message });
    if !kits::valid_name(&kit) {
        return failed(format!("invalid kit name {kit:?}"));
    }
    if fds.len() != 3 {
        return failed("kit request without stdin, stdout and stderr".into());
    }
    let req = agent.next_kit_req.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = mpsc::channel();
    lock(&agent.kit_waiters).insert(req, tx);
    let borrowed: Vec<_> = fds.iter().map(AsFd::as_fd).collect();
    let sent = proto::send(
        &agent.chan,
        &FromAgent::KitRun {
            req,
            kit,
            args,
            env,
        },
        &borrowed,
    );
    drop(borrowed);
    drop(fds);
    if let Err(e) = sent {
        lock(&agent.kit_waiters).remove(&req);
        return failed(format!("relaying the kit request: {e}"));
    }

    // The wrapper never sends again: end of stream means it died, so cancel the kit job.
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (agent, conn, done) = (Arc::clone(agent), Arc::clone(conn), Arc::clone(&done));
        std::thread::Builder::new()
            .name("kit-watch".into())
            .spawn(move || {
                let _ = conn.set_recv_timeout(None);
                let _ = conn.recv();
                if !done.load(Ordering::SeqCst) {
                    agent.report(FromAgent::KitCancel { req });
                }
            })
    };
    let reply = rx.recv().unwrap_or_else(|_| KitReply::Failed {
        code: 1,
        message: "the project shell is shutting down".into(),
    });
    done.store(true, Ordering::SeqCst);
    let _ = proto::send(conn, &reply, &[]);
    conn.shutdown();
    if let Ok(watcher) = watcher {
        let _ = watcher.join();
    }
    None
}
