//! Signals mapped to intent in one place. This module only translates; the
//! supervisor in `daemon` decides what each command does in each phase.
//! It hears them as [`Commands`], of which the process's signals are one
//! source ([`Commands::from_signals`]) and a channel another
//! ([`Commands::channel`]): a test drives a daemon inside its own process
//! through the channel, as mini-redis's `run(listener, shutdown)` is.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// SIGHUP: start a new generation.
    Reload,
    /// SIGTERM, SIGINT or SIGQUIT (nginx's graceful stop, whose default
    /// action would dump core): the ordered stop (a second one forces).
    Stop,
    /// SIGUSR2: a draining generation force-closes what it still holds now
    /// (a newer generation sends it when `reload.max_draining` is exceeded).
    /// A serving generation ignores it.
    ForceDrain,
}

/// SIGUSR1 (logrotate's `systemctl kill --signal=USR1 baton`, which reaches
/// every process of the unit) must never kill a baton process, and its
/// default action is to: a `baton reload` run by `ExecReload`, a `baton
/// check` an operator runs, a new generation before its handlers are
/// in place. So every baton process blocks it first thing (a blocked
/// signal waits, and the mask survives `exec`: a new generation's spawn
/// blocks it in the child, whatever the spawning thread's mask, so it is
/// covered from its first instruction, see `process::spawn_detached`);
/// only a generation that reopens logs on it lets it through, once its
/// handler is installed.
pub fn hold_sigusr1() {
    let _ = usr1().thread_block();
}

/// SIGHUP (`systemctl kill -s HUP baton`, a reload by signal) and SIGUSR2
/// (`systemctl kill -s USR2 baton`, ending older generations' drains)
/// reach every process of the unit too, and must not kill a `baton
/// reload` run by `ExecReload` (its `systemctl reload` would fail while
/// the reload goes on), nor a `baton check`: those two hold them, once
/// their arguments are read. Not the daemon, whose handlers are in place
/// first thing (a new generation's spawn has them ignored until then, see
/// `process::spawn_detached`, and a blocked SIGHUP would be kept pending
/// though ignored, a reload asked of a reload still starting turned into
/// a second one), nor `demo`, whose daemon would inherit them held.
pub fn hold_unit_signals() {
    let mut held = nix::sys::signal::SigSet::empty();
    held.add(nix::sys::signal::Signal::SIGHUP);
    held.add(nix::sys::signal::Signal::SIGUSR2);
    let _ = held.thread_block();
}

fn usr1() -> nix::sys::signal::SigSet {
    let mut set = nix::sys::signal::SigSet::empty();
    set.add(nix::sys::signal::Signal::SIGUSR1);
    set
}

pub struct Signals {
    hup: Signal,
    term: Signal,
    int: Signal,
    quit: Signal,
    usr1: Signal,
    usr2: Signal,
    /// What SIGUSR1 does (reopen the access logs), in whatever phase the
    /// generation is: logrotate's signal must never wait for a phase.
    reopen: Reopen,
    /// Set by the stop signals' handler itself, as it runs (see
    /// [`Commands::stop_queued`]).
    stop_arrived: Arc<AtomicBool>,
}

/// What SIGUSR1 runs, set once the generation's access logs are open.
type Reopen = Arc<OnceLock<Box<dyn Fn() + Send + Sync>>>;

impl Signals {
    /// Installs every handler; called first thing, so a SIGHUP during
    /// start-up is never the default "terminate". The streams come before
    /// the stop flag: a stop signal between the two is then heard, only
    /// later than the flag would have told it, where the other way round
    /// it set the flag and made no command (a first start never said it
    /// was ready, and served until another signal).
    pub fn install() -> std::io::Result<Signals> {
        let signals = Signals {
            hup: signal(SignalKind::hangup())?,
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            quit: signal(SignalKind::quit())?,
            usr1: signal(SignalKind::user_defined1())?,
            usr2: signal(SignalKind::user_defined2())?,
            reopen: Reopen::default(),
            stop_arrived: Arc::new(AtomicBool::new(false)),
        };
        for stop in [
            SignalKind::terminate(),
            SignalKind::interrupt(),
            SignalKind::quit(),
        ] {
            signal_hook::flag::register(stop.as_raw_value(), Arc::clone(&signals.stop_arrived))?;
        }
        // The handler is in place: this thread may take SIGUSR1 now
        // (threads created later inherit that and may take it too; a new
        // generation's spawn blocks it again in the child).
        let _ = usr1().thread_unblock();
        Ok(signals)
    }

    /// The next signal that means something; stray ones are logged here.
    async fn recv(&mut self) -> Command {
        loop {
            tokio::select! {
                _ = self.hup.recv() => return Command::Reload,
                _ = self.term.recv() => return Command::Stop,
                _ = self.int.recv() => return Command::Stop,
                _ = self.quit.recv() => return Command::Stop,
                _ = self.usr1.recv() => match self.reopen.get() {
                    Some(reopen) => {
                        tracing::info!(signal = "SIGUSR1", "reopening the access logs");
                        reopen();
                    }
                    None => tracing::info!(signal = "SIGUSR1", "ignored signal"),
                },
                _ = self.usr2.recv() => return Command::ForceDrain,
            }
        }
    }
}

/// How long a stop whose handler ran may take to reach the queue (a turn
/// of tokio's driver and of the forwarding task) before it is given up on.
const STOP_ON_ITS_WAY: std::time::Duration = std::time::Duration::from_secs(1);

/// The commands one generation hears, whatever sends them.
pub struct Commands {
    rx: mpsc::Receiver<Command>,
    reopen: Reopen,
    /// Signals queued and not yet heard, one bit per command: a signal
    /// repeated before the generation heard the first is one command, as
    /// the kernel merges a pending signal (two SIGTERMs during start-up are
    /// one stop, not a stop and then a forced drain). It also bounds the
    /// queue to one entry per command, so queuing never waits and SIGUSR1
    /// is never held up behind it.
    queued: Arc<AtomicU8>,
    /// The older generation's word that the service stops (see
    /// [`Commands::stop_word`]).
    stop_word: CancellationToken,
    stops: StopsHeard,
    /// A stop signal arrived, set by its handler (false for commands sent
    /// by hand).
    stop_arrived: Arc<AtomicBool>,
    /// Cancelled as a stop signal is queued (never for commands sent by
    /// hand): what a first start's slow steps are raced against.
    stop_signal: CancellationToken,
}

/// The stops heard so far. The older generation's word and the stop
/// signal that usually comes with it are one stop, whichever comes first:
/// under systemd a stop signals the unit's whole control group, so a new
/// generation that the stop caught taking over hears both. Only a signal
/// beyond that one forces.
#[derive(Debug, Default)]
struct StopsHeard {
    word: bool,
    signals: u32,
}

impl StopsHeard {
    /// The word came: a stop, unless a signal already began one.
    fn word(&mut self) -> Option<Command> {
        self.word = true;
        (self.signals == 0).then_some(Command::Stop)
    }

    /// A command came: a stop signal after the word is the word's stop.
    fn command(&mut self, command: Command) -> Option<Command> {
        if command != Command::Stop {
            return Some(command);
        }
        self.signals += 1;
        if self.word && self.signals == 1 {
            tracing::info!("stop signal: already stopping at the older generation's word");
            return None;
        }
        Some(command)
    }
}

/// The signal forwarder's side of [`Commands`].
struct Queue {
    tx: mpsc::Sender<Command>,
    queued: Arc<AtomicU8>,
    stop_signal: CancellationToken,
}

impl Queue {
    /// The forwarder's side of `commands`, whose channel `tx` sends on.
    fn feeding(commands: &Commands, tx: mpsc::Sender<Command>) -> Queue {
        Queue {
            tx,
            queued: Arc::clone(&commands.queued),
            stop_signal: commands.stop_signal.clone(),
        }
    }

    /// Queues `command` unless the same one waits unheard (then it is that
    /// one); false once the generation is gone.
    fn push(&self, command: Command) -> bool {
        if command == Command::Stop {
            self.stop_signal.cancel();
        }
        let already = self.queued.fetch_or(bit(command), Ordering::AcqRel) & bit(command) != 0;
        // At most one entry per command waits: never short of room.
        already || self.tx.try_send(command).is_ok()
    }
}

fn bit(command: Command) -> u8 {
    match command {
        Command::Stop => 1,
        Command::Reload => 2,
        Command::ForceDrain => 4,
    }
}

impl Commands {
    /// Commands sent by hand: what a test holds to stop a daemon it runs
    /// in its own process.
    pub fn channel() -> (mpsc::Sender<Command>, Commands) {
        let (tx, rx) = mpsc::channel(16);
        let commands = Commands {
            rx,
            reopen: Reopen::default(),
            queued: Arc::default(),
            stop_word: CancellationToken::new(),
            stops: StopsHeard::default(),
            stop_arrived: Arc::default(),
            stop_signal: CancellationToken::new(),
        };
        (tx, commands)
    }

    /// The process's signals, read by a task of their own from now on (so
    /// SIGUSR1 reopens the logs whatever the generation is doing). Must be
    /// called inside the runtime.
    pub fn from_signals(mut signals: Signals) -> Commands {
        let (tx, mut commands) = Commands::channel();
        signals.reopen = Arc::clone(&commands.reopen);
        commands.stop_arrived = Arc::clone(&signals.stop_arrived);
        let queue = Queue::feeding(&commands, tx);
        tokio::spawn(async move { while queue.push(signals.recv().await) {} });
        commands
    }

    /// Runs `hook` at every SIGUSR1 from now on (the first hook set stays:
    /// a generation opens its access logs once).
    pub fn on_reopen(&self, hook: impl Fn() + Send + Sync + 'static) {
        let _ = self.reopen.set(Box::new(hook));
    }

    /// A stop signal waits unheard: a new generation checks before it
    /// says it is ready and again once told to go ahead, so a stop sent to
    /// it alone fails the reload (the older one serves on) instead of
    /// stopping the service once it serves; a serving generation checks as
    /// a reload succeeds, so a stop that came first is handled first.
    /// Its handler's own mark counts too: the queue has it only once tokio's
    /// driver turned and the forwarding task ran, and a start-up that never
    /// waited since the signal came (its config read through a FIFO, which
    /// held the runtime's one thread while the signal came, then its checks
    /// answered at once) gave them no turn before this is asked. (Commands
    /// are heard only from serving on, and every stop heard ends the
    /// serving, so a stop that arrived is one that waits.)
    pub fn stop_queued(&self) -> bool {
        self.stop_arrived.load(Ordering::Acquire)
            || self.queued.load(Ordering::Acquire) & bit(Command::Stop) != 0
    }

    /// Hears the stop [`Self::stop_queued`] said waits, and returns when it
    /// was asked. Its handler has run, so tokio's driver has it and the
    /// forwarding task queues it once they next turn. Commands that came
    /// between are ignored: the stop wins. Bounded all the same: should it
    /// never come, the generation stops rather than sit in a reload with
    /// no main process named.
    pub async fn hear_the_stop(&mut self) -> tokio::time::Instant {
        let asked = tokio::time::Instant::now();
        let heard = async {
            loop {
                match self.recv().await {
                    Command::Stop => return,
                    other => tracing::info!(command = ?other, "ignored: a stop came first"),
                }
            }
        };
        if tokio::time::timeout(STOP_ON_ITS_WAY, heard).await.is_err() {
            tracing::warn!("a stop signal's handler ran but its stop was never heard; stopping");
        }
        asked
    }

    /// Cancelled once a stop signal came, heard or not yet: a first start
    /// stops waiting for its backends' first answers then (it is not heard
    /// as a command before the generation serves).
    pub fn stop_signal(&self) -> CancellationToken {
        self.stop_signal.clone()
    }

    /// What the older generation uses to say the service stops: it stops
    /// with us when a stop caught it handing over to us. Said more than
    /// once, it is one word.
    pub fn stop_word(&self) -> CancellationToken {
        self.stop_word.clone()
    }

    /// The next command. Once every sender is gone none comes again: a
    /// dropped channel is no stop (a stop is always said).
    pub async fn recv(&mut self) -> Command {
        loop {
            let heard = tokio::select! {
                biased;
                command = next_sent(&mut self.rx, &self.queued) => self.stops.command(command),
                () = self.stop_word.cancelled(), if !self.stops.word => self.stops.word(),
            };
            if let Some(command) = heard {
                return command;
            }
        }
    }
}

/// The next command sent; pending for good once every sender is gone.
async fn next_sent(rx: &mut mpsc::Receiver<Command>, queued: &AtomicU8) -> Command {
    match rx.recv().await {
        Some(command) => {
            queued.fetch_and(!bit(command), Ordering::AcqRel);
            command
        }
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_signal_repeated_before_it_was_heard_is_one_command() {
        let (tx, mut commands) = Commands::channel();
        let queue = Queue::feeding(&commands, tx);
        for command in [
            Command::Stop,
            Command::Reload,
            Command::Stop,
            Command::Reload,
        ] {
            assert!(queue.push(command));
        }
        assert_eq!(commands.recv().await, Command::Stop);
        assert_eq!(commands.recv().await, Command::Reload);
        let more = tokio::time::timeout(std::time::Duration::from_secs(60), commands.recv());
        assert!(more.await.is_err(), "the repeats were merged");
        // Heard, then said again: a second command (a second stop forces).
        assert!(queue.push(Command::Stop));
        assert_eq!(commands.recv().await, Command::Stop);
    }

    /// What a first start races its slow steps against: a stop signal,
    /// queued, cancels it; no other command does.
    #[test]
    fn only_a_stop_signal_cancels_the_stop_signal_token() {
        let (tx, commands) = Commands::channel();
        let queue = Queue::feeding(&commands, tx);
        assert!(queue.push(Command::Reload) && queue.push(Command::ForceDrain));
        assert!(!commands.stop_signal().is_cancelled());
        assert!(queue.push(Command::Stop));
        assert!(commands.stop_signal().is_cancelled());
    }

    #[tokio::test(start_paused = true)]
    async fn commands_come_in_order_and_a_dropped_sender_is_no_stop() {
        let (tx, mut commands) = Commands::channel();
        for command in [Command::Reload, Command::Stop] {
            tx.send(command).await.expect("send");
        }
        drop(tx);
        assert_eq!(commands.recv().await, Command::Reload);
        assert_eq!(commands.recv().await, Command::Stop);
        let after = tokio::time::timeout(std::time::Duration::from_secs(60), commands.recv());
        assert!(after.await.is_err(), "no command once the sender is gone");
    }

    /// One step of a stop's story, as a generation sees it.
    enum Step {
        /// The older generation's word arrives.
        Word,
        /// A stop signal arrives.
        Signal,
        /// The generation hears a stop now.
        HearsStop,
        /// It hears nothing within a minute.
        HearsNothing,
    }

    async fn replay(steps: &[Step]) {
        let (tx, mut commands) = Commands::channel();
        for step in steps {
            match step {
                Step::Word => commands.stop_word().cancel(),
                Step::Signal => tx.send(Command::Stop).await.expect("send"),
                Step::HearsStop => assert_eq!(commands.recv().await, Command::Stop),
                Step::HearsNothing => {
                    let more = tokio::time::timeout(Duration::from_secs(60), commands.recv());
                    assert!(more.await.is_err(), "no further command");
                }
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_older_generations_word_and_one_stop_signal_are_one_stop() {
        use Step::*;
        // The word first, then the signal systemd sent the whole unit (the
        // word said again is still one); a second signal forces, as ever.
        replay(&[
            Word,
            HearsStop,
            Signal,
            Word,
            HearsNothing,
            Signal,
            HearsStop,
        ])
        .await;
        // The signal first, then the word.
        replay(&[Signal, HearsStop, Word, HearsNothing, Signal, HearsStop]).await;
        // Both waiting at once.
        replay(&[Signal, Word, HearsStop, HearsNothing]).await;
        // The word alone (a stop that reached the older generation only).
        replay(&[Word, HearsStop, HearsNothing]).await;
    }

    /// A stop on its way is heard past the commands that came between,
    /// which are not heard after it; one that never comes is not waited
    /// for long.
    #[tokio::test(start_paused = true)]
    async fn a_stop_on_its_way_is_heard_past_other_commands_and_waited_for_a_while() {
        let (tx, mut commands) = Commands::channel();
        for command in [Command::Reload, Command::ForceDrain, Command::Stop] {
            tx.send(command).await.expect("send");
        }
        let asked = tokio::time::Instant::now();
        assert_eq!(commands.hear_the_stop().await, asked);
        let more = tokio::time::timeout(Duration::from_secs(60), commands.recv());
        assert!(more.await.is_err(), "what came before the stop is gone");
        let asked = commands.hear_the_stop().await;
        assert_eq!(asked.elapsed(), STOP_ON_ITS_WAY);
    }

    #[tokio::test(start_paused = true)]
    async fn other_commands_pass_the_word_unchanged() {
        let (tx, mut commands) = Commands::channel();
        tx.send(Command::Reload).await.expect("send");
        commands.stop_word().cancel();
        assert_eq!(commands.recv().await, Command::Reload);
        assert_eq!(commands.recv().await, Command::Stop);
        tx.send(Command::ForceDrain).await.expect("send");
        assert_eq!(commands.recv().await, Command::ForceDrain);
    }
}
