//! `/metrics` is rendered on a thread of its own, one render at a time: a
//! large config's exposition takes milliseconds to render and merge, and
//! the admin shares the supervisor's one worker thread with the health
//! checks, the watchdog and the handoff, so scrapes in a loop (a
//! misconfigured scraper, or any local user) held checks past their
//! timeout until healthy backends were marked down. Scrapes that come
//! together wait their turn: the CPU they take is one render's at a time.
//!
//! The thread is made as the admin starts, not taken from tokio's blocking
//! pool: that pool makes a thread for a scrape once its last one has idled
//! out (10 s, under a 15 s scrape interval), and one it could not make (a
//! pid or thread limit reached) panicked the scrape with the render left in
//! its queue, holding the turn: every later scrape waited for good.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use super::{places, AdminShared};

/// A render asked for: whose exposition, and where its text goes.
type Job = (Arc<AdminShared>, oneshot::Sender<String>);

/// The way to the render thread; the thread ends once this is dropped.
#[derive(Debug)]
pub struct Renderer {
    jobs: mpsc::Sender<Job>,
}

impl Renderer {
    /// Starts the render thread.
    pub fn start() -> std::io::Result<Renderer> {
        // As many as the admin holds connections: each waits for one.
        let (jobs, mut waiting) = mpsc::channel::<Job>(places::MAX_CONNECTIONS);
        std::thread::Builder::new()
            .name("baton-metrics".into())
            .spawn(move || {
                while let Some((state, reply)) = waiting.blocking_recv() {
                    // A scraper gone while it waited costs no render.
                    if reply.is_closed() {
                        continue;
                    }
                    // A render that panics fails its own scrape (its reply
                    // dropped: a 500), not the thread every later one needs.
                    let render = std::panic::AssertUnwindSafe(|| state.render_metrics());
                    if let Ok(text) = std::panic::catch_unwind(render) {
                        let _ = reply.send(text);
                    }
                }
            })?;
        Ok(Renderer { jobs })
    }

    /// `state`'s exposition, once the renders asked for before it are done;
    /// `None` if the render failed (it panicked) or the thread is gone.
    pub async fn render(&self, state: Arc<AdminShared>) -> Option<String> {
        let (reply, text) = oneshot::channel();
        self.jobs.send((state, reply)).await.ok()?;
        text.await.ok()
    }
}
