//! One whole MCP session in process, over `tokio::io::duplex`: the real transport,
//! handler, tool table and admission path, with a scripted `marsh` standing in for the
//! runtime (the black-box suites drive the real stand-ins through the binary).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, ReadHalf, WriteHalf};

use super::serve_session;
use crate::cli::ServeArgs;
use crate::startup::prepare;

/// Answers the verbs marsh-mcp sends: `-c CMD` runs CMD; `results show` knows no
/// receipt (exit 3, the no-match status); `status`/`results` print fixed JSON.
const FAKE_MARSH: &str = r#"#!/bin/sh
case "$1" in
  -c) exec /bin/sh -c "$2" ;;
  status) echo '{"daemon":{"state":"running"},"shell":{"isolation":"bwrap"},"workspace":"/hidden"}' ;;
  results)
    if [ "$2" = show ]; then echo "marsh: no result matches $3" >&2; exit 3; fi
    echo '{"results":[]}' ;;
  *) echo "marsh: unexpected $*" >&2; exit 2 ;;
esac
"#;

struct Fixture {
    _dir: tempfile::TempDir,
    args: ServeArgs,
    env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
}

fn executable(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path();
    std::fs::set_permissions(base, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = base.join("bin");
    std::fs::create_dir(&bin).unwrap();
    executable(&bin.join("marsh"), FAKE_MARSH);
    executable(&bin.join("marshd"), "#!/bin/sh\nexit 0\n");
    executable(&bin.join("sbx"), "#!/bin/sh\nexit 0\n");
    let workspace = base.join("workspace");
    std::fs::create_dir(&workspace).unwrap();
    let home: PathBuf = base.join("home");
    let args = ServeArgs {
        workspace: Some(workspace),
        home: Some(home),
        scope_root: None,
        marsh: Some(bin.join("marsh")),
        sbx: Some(bin.join("sbx")),
        allow_full_sbx_control: false,
        declaration: None,
        expected_generation: None,
        idle_exit_secs: None,
    };
    let user_home = base.join("user-home");
    std::fs::create_dir(&user_home).unwrap();
    let env = vec![
        ("HOME".into(), user_home.into_os_string()),
        ("PATH".into(), "/usr/bin:/bin".into()),
    ];
    Fixture {
        _dir: dir,
        args,
        env,
    }
}

struct Client {
    lines: tokio::io::Lines<BufReader<ReadHalf<DuplexStream>>>,
    write: WriteHalf<DuplexStream>,
    next_id: u64,
}

impl Client {
    async fn send(&mut self, frame: &[u8]) {
        self.write.write_all(frame).await.unwrap();
        self.write.write_all(b"\n").await.unwrap();
        self.write.flush().await.unwrap();
    }

    async fn reply(&mut self) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(20), self.lines.next_line())
            .await
            .expect("a reply within 20 s")
            .unwrap()
            .expect("the session is still open");
        serde_json::from_str(&line).unwrap()
    }

    async fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let frame = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.send(frame.to_string().as_bytes()).await;
        let reply = self.reply().await;
        assert_eq!(reply["id"], id, "{reply}");
        reply
    }

    async fn call(&mut self, tool: &str, arguments: Value) -> Value {
        let reply = self
            .request("tools/call", json!({"name": tool, "arguments": arguments}))
            .await;
        reply["result"]["structuredContent"].clone()
    }
}

async fn session() -> (Client, tokio::task::JoinHandle<Result<(), String>>, Fixture) {
    let fx = fixture();
    let ctx = Arc::new(prepare(&fx.args, &fx.env).unwrap());
    let (client_side, server_side) = tokio::io::duplex(4 << 20);
    let (server_read, server_write) = tokio::io::split(server_side);
    let served = tokio::spawn(serve_session(
        ctx,
        Arc::default(),
        BufReader::new(server_read),
        server_write,
    ));
    let (read, write) = tokio::io::split(client_side);
    let mut client = Client {
        lines: BufReader::new(read).lines(),
        write,
        next_id: 0,
    };
    let init = client
        .request(
            "initialize",
            json!({
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "session-test", "version": "0"}
            }),
        )
        .await;
    assert_eq!(init["result"]["serverInfo"]["name"], "marsh-mcp", "{init}");
    client
        .send(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
        .await;
    (client, served, fx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_lists_calls_refuses_and_survives_bad_frames() {
    let (mut client, served, _fx) = session().await;

    let listed = client.request("tools/list", json!({})).await;
    assert_eq!(listed["result"]["tools"].as_array().unwrap().len(), 23);

    let run = client
        .call(
            "shell_run",
            json!({"command": "printf hi; printf oops >&2"}),
        )
        .await;
    assert_eq!(run["ok"], true, "{run}");
    assert_eq!(run["data"]["state"], "succeeded");
    assert_eq!(run["data"]["kind"], "shell_run");
    assert_eq!(run["data"]["stdout_text"], "hi");
    assert_eq!(run["data"]["stderr_text"], "oops");
    assert_eq!(run["data"]["output_complete"], true);

    // Status passes runtime fields through and keeps host paths on the host.
    let status = client.call("status", json!({})).await;
    assert_eq!(status["data"]["runtime_state"], "present", "{status}");
    assert!(!status.to_string().contains("/hidden"));

    // marsh's no-match exit status, not its words, makes this not_found.
    let missing = client.call("result_get", json!({"selector": "abc"})).await;
    assert_eq!(missing["error"]["kind"], "not_found", "{missing}");

    let bad = client
        .call("shell_run", json!({"command": "true", "cwd": "/"}))
        .await;
    assert_eq!(bad["error"]["kind"], "invalid_argument", "{bad}");

    let unknown = client
        .request("tools/call", json!({"name": "shell", "arguments": {}}))
        .await;
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");

    // An oversized frame is answered and discarded; the session goes on.
    let mut huge = vec![b'x'; marsh_framing::MAX_FRAME_BYTES + 1];
    huge.extend_from_slice(b"yz");
    client.send(&huge).await;
    let answer = client.reply().await;
    assert_eq!(answer["error"]["code"], -32600, "{answer}");
    let again = client.call("scope_list", json!({})).await;
    assert_eq!(again["ok"], true, "{again}");

    client.write.shutdown().await.unwrap();
    served.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fifth_operation_is_refused_and_a_closed_session_cancels_its_work() {
    let (mut client, served, _fx) = session().await;
    let mut ids = Vec::new();
    for _ in 0..4 {
        let run = client
            .call("shell_run", json!({"command": "sleep 30", "wait_ms": 0}))
            .await;
        assert_eq!(run["data"]["state"], "running", "{run}");
        ids.push(run["data"]["operation_id"].as_str().unwrap().to_owned());
    }
    let fifth = client
        .call("shell_run", json!({"command": "true", "wait_ms": 0}))
        .await;
    assert_eq!(fifth["error"]["kind"], "capacity_exhausted", "{fifth}");
    assert_eq!(fifth["error"]["retryable"], true);

    let cancelled = client
        .call("operation_cancel", json!({"operation_id": ids[0]}))
        .await;
    assert_eq!(
        cancelled["data"]["state"], "cancellation_uncertain",
        "{cancelled}"
    );
    // The freed slot admits the next run.
    let next = client.call("shell_run", json!({"command": "true"})).await;
    assert_eq!(next["data"]["state"], "succeeded", "{next}");

    // Input ends: the session cancels its remaining operations and ends cleanly.
    client.write.shutdown().await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), served)
        .await
        .expect("the session ends after cancelling its work")
        .unwrap()
        .unwrap();
}
