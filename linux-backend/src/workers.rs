//! Threads kept for reuse: the daemon's per-connection work, the run watcher and the
//! agent's per-job runner each used to spawn a thread on every `marsh -c`; a parked
//! worker takes the task instead, and a new thread is spawned only when none is idle.
//!
//! Invariants:
//! - `idle` counts workers that finished their task and have not been handed another;
//!   a caller that decrements it owns one of them, so the task it sends is received
//!   (by that worker or by another idle one) and never waits for a busy worker;
//! - a worker retires after [`IDLE_RETIRE`] without a task only if it can take itself
//!   out of `idle` (if a caller already claimed it, a task is on its way: it stays);
//! - concurrency is not bounded here: a task that blocks for a job's whole duration
//!   holds its worker, and the next caller gets a new thread (as before).
//!
//! Rejected alternative: a fixed-size pool. Connections and jobs block for as long as
//! their command runs; a fixed pool would make the (N+1)th concurrent command wait.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::util::lock;

type Task = Box<dyn FnOnce() + Send + 'static>;

/// How long an idle worker waits for a task before it exits.
const IDLE_RETIRE: Duration = Duration::from_secs(30);

pub struct Workers {
    name: &'static str,
    idle: Arc<AtomicUsize>,
    tasks: Mutex<Sender<Task>>,
    queue: Arc<Mutex<Receiver<Task>>>,
}

impl Workers {
    pub fn new(name: &'static str) -> Self {
        let (tx, rx) = mpsc::channel();
        Self {
            name,
            idle: Arc::new(AtomicUsize::new(0)),
            tasks: Mutex::new(tx),
            queue: Arc::new(Mutex::new(rx)),
        }
    }

    /// Runs `task` on an idle worker, or on a new thread when none is idle.
    pub fn run(&self, task: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
        let mut task: Task = Box::new(task);
        let claimed = self
            .idle
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok();
        if claimed {
            match lock(&self.tasks).send(task) {
                Ok(()) => return Ok(()),
                // Only if the queue's receiver were gone, which `self` keeps alive.
                Err(mpsc::SendError(back)) => task = back,
            }
        }
        let (idle, queue) = (Arc::clone(&self.idle), Arc::clone(&self.queue));
        std::thread::Builder::new()
            .name(self.name.into())
            .spawn(move || {
                task();
                park(&idle, &queue);
            })
            .map(drop)
    }
}

/// Takes tasks until none comes for [`IDLE_RETIRE`] and the worker can retire.
fn park(idle: &AtomicUsize, queue: &Mutex<Receiver<Task>>) {
    idle.fetch_add(1, Ordering::AcqRel);
    loop {
        let next = lock(queue).recv_timeout(IDLE_RETIRE);
        match next {
            Ok(task) => {
                task();
                idle.fetch_add(1, Ordering::AcqRel);
            }
            Err(RecvTimeoutError::Timeout) => {
                let retired = idle
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                    .is_ok();
                if retired {
                    return;
                }
            }
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::collections::HashSet;
    use std::sync::mpsc;

    use super::*;

    #[test]
    fn sequential_tasks_reuse_one_thread_and_concurrent_ones_get_their_own() {
        let workers = Workers::new("test-worker");
        let (tx, rx) = mpsc::channel();
        let mut threads = HashSet::new();
        for _ in 0..20 {
            let tx = tx.clone();
            workers
                .run(move || tx.send(std::thread::current().id()).unwrap())
                .unwrap();
            threads.insert(rx.recv().unwrap());
            // Let the worker park before the next task is handed out.
            while workers.idle.load(Ordering::Acquire) == 0 {
                std::thread::yield_now();
            }
        }
        assert_eq!(threads.len(), 1, "sequential tasks reuse the parked worker");

        // Blocking tasks never wait for each other.
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let release_rx = Arc::new(Mutex::new(release_rx));
        let (started_tx, started_rx) = mpsc::channel();
        for _ in 0..4 {
            let (release_rx, started_tx) = (Arc::clone(&release_rx), started_tx.clone());
            workers
                .run(move || {
                    started_tx.send(()).unwrap();
                    let _ = lock(&release_rx).recv();
                })
                .unwrap();
        }
        for _ in 0..4 {
            started_rx
                .recv_timeout(Duration::from_secs(5))
                .expect("every blocking task started");
        }
        drop(release_tx);
    }
}
