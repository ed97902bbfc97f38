//! The data plane's threads: `workers` of them, each a current-thread tokio
//! runtime. A listener's SO_REUSEPORT shards are spread over them, and a
//! connection lives its whole life on the worker whose shard accepted it,
//! with that worker's idle backend connections: its data never crosses
//! threads and its tasks never meet another thread's scheduler. The main
//! runtime keeps the lifecycle, the admin server and the probes.

use std::cell::Cell;

use tokio::runtime::Handle;

thread_local! {
    /// This thread's worker number (0 off the workers).
    static WORKER: Cell<usize> = const { Cell::new(0) };
}

/// The worker the calling thread is (0 for any other thread).
pub fn current() -> usize {
    WORKER.get()
}

pub struct Workers {
    handles: Vec<Handle>,
}

impl Workers {
    /// Starts `count` worker threads; they run until the process exits.
    pub fn start(count: usize) -> std::io::Result<Workers> {
        let mut handles = Vec::with_capacity(count);
        for index in 0..count.max(1) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            handles.push(runtime.handle().clone());
            std::thread::Builder::new()
                .name(format!("baton-worker-{index}"))
                .spawn(move || {
                    WORKER.set(index);
                    runtime.block_on(std::future::pending::<()>());
                })?;
        }
        Ok(Workers { handles })
    }

    /// The worker that runs shard number `shard` of a listener.
    pub fn for_shard(&self, shard: usize) -> &Handle {
        &self.handles[shard % self.handles.len()]
    }

    pub fn count(&self) -> usize {
        self.handles.len()
    }
}
