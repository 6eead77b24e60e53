//! Child processes that cannot outlive the test process.
//!
//! Every process this crate starts (the components, and `go` while building) gets
//! `PR_SET_PDEATHSIG = SIGKILL`, so the kernel kills it when its parent goes away: on a
//! panic that aborts, a `SIGKILL` of the test binary, or a normal exit that never drops a
//! `static` plane. Linux sends that signal when the *thread* that forked the child exits, not
//! the process, so all forks happen on one spawner thread that is never joined and lives as
//! long as the process. (A fork from a `#[tokio::test]` thread would kill the shared plane as
//! soon as the first test finished.)
//!
//! Stopping in order is the job of [`Component::stop`]: `SIGTERM`, a grace period, `SIGKILL`.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

use crate::error::{Error, Result};

/// How many log lines an error about a component shows.
pub(crate) const TAIL_LINES: usize = 30;

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

/// Spawns `cmd` so that it cannot outlive this process: from the process-lifetime spawner
/// thread, with `PR_SET_PDEATHSIG = SIGKILL`. Tests use it for every process they start.
pub fn spawn(mut cmd: Command) -> io::Result<Child> {
    let parent = rustix::process::getpid();
    let arm_death_signal = move || {
        rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
        // The parent may have died between fork and prctl; then nobody would ever kill us.
        if rustix::process::getppid() != Some(parent) {
            return Err(io::Error::other("parent exited before the child started"));
        }
        Ok(())
    };
    // SAFETY: the closure runs between fork and exec, where only async-signal-safe calls are
    // allowed; prctl and getppid are plain system calls that neither allocate nor lock.
    #[allow(unsafe_code)] // pre_exec is the only way to arm PR_SET_PDEATHSIG in the child.
    unsafe {
        cmd.pre_exec(arm_death_signal);
    }

    let (reply_tx, reply_rx) = mpsc::channel();
    spawner()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .send((cmd, reply_tx))
        .map_err(|_| io::Error::other("the spawner thread is gone"))?;
    reply_rx
        .recv()
        .map_err(|_| io::Error::other("the spawner thread is gone"))?
}

fn spawner() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        thread::Builder::new()
            .name("testenv-spawner".into())
            .spawn(move || {
                // The sender lives in a static and is never dropped, so this loop never ends
                // and the thread, the parent of every child, lives until the process exits.
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("spawning the testenv-spawner thread");
        Mutex::new(tx)
    })
}

/// How a component was started, kept so it can be started again the same way.
#[derive(Debug, Clone)]
struct Launch {
    program: std::ffi::OsString,
    args: Vec<std::ffi::OsString>,
    /// Changes to the inherited environment; `None` removes the variable.
    envs: Vec<(std::ffi::OsString, Option<std::ffi::OsString>)>,
    current_dir: Option<PathBuf>,
}

impl Launch {
    fn of(cmd: &Command) -> Launch {
        Launch {
            program: cmd.get_program().to_owned(),
            args: cmd.get_args().map(ToOwned::to_owned).collect(),
            envs: cmd
                .get_envs()
                .map(|(k, v)| (k.to_owned(), v.map(ToOwned::to_owned)))
                .collect(),
            current_dir: cmd.get_current_dir().map(Path::to_path_buf),
        }
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args);
        for (key, value) in &self.envs {
            match value {
                Some(value) => cmd.env(key, value),
                None => cmd.env_remove(key),
            };
        }
        if let Some(dir) = &self.current_dir {
            cmd.current_dir(dir);
        }
        cmd
    }
}

/// One component: its process, the log file holding its stdout and stderr, and how it was
/// started (for [`Component::restart`]).
#[derive(Debug)]
pub(crate) struct Component {
    pub(crate) name: &'static str,
    pub(crate) log: PathBuf,
    launch: Launch,
    child: Child,
    /// Set once the process has been reaped.
    exit: Option<ExitStatus>,
    /// Set when the process was stopped on purpose; its exit is then no crash.
    stopped: bool,
}

impl Component {
    /// Starts `program args…` with stdout and stderr written to `log`, which is truncated.
    ///
    /// The child gets its own process group, so a Ctrl-C in the terminal reaches only the
    /// test process, which then stops the components in order instead of all at once.
    pub(crate) fn start(name: &'static str, cmd: Command, log: PathBuf) -> Result<Component> {
        let launch = Launch::of(&cmd);
        let child = Self::spawn(name, cmd, &log, false)?;
        Ok(Component {
            name,
            log,
            launch,
            child,
            exit: None,
            stopped: false,
        })
    }

    /// Starts the exited process again with the same program, arguments, environment and
    /// working directory, appending to its log.
    pub(crate) fn restart(&mut self) -> Result<()> {
        if self.exited().is_none() {
            return Err(self.error("is still running; stop it before starting it again"));
        }
        self.child = Self::spawn(self.name, self.launch.command(), &self.log, true)?;
        self.exit = None;
        self.stopped = false;
        Ok(())
    }

    fn spawn(name: &'static str, mut cmd: Command, log: &Path, append: bool) -> Result<Child> {
        let out = File::options()
            .write(true)
            .create(true)
            .append(append)
            .truncate(!append)
            .open(log)
            .map_err(|e| Error::io(format!("opening {}", log.display()), e))?;
        let err = out
            .try_clone()
            .map_err(|e| Error::io(format!("duplicating {}", log.display()), e))?;
        cmd.stdin(std::process::Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        spawn(cmd).map_err(|e| Error::io(format!("starting {name}"), e))
    }

    /// The process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process was stopped on purpose and not started again.
    pub(crate) fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// The exit status if the process has ended, without blocking.
    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().ok().flatten();
        }
        self.exit
    }

    /// An error naming this component, with the tail of its log.
    pub(crate) fn error(&self, problem: impl Into<String>) -> Error {
        Error::Component {
            component: self.name,
            problem: problem.into(),
            log: self.log.clone(),
            tail: tail(&self.log, TAIL_LINES),
        }
    }

    /// `Err` naming the component if it has exited without being stopped on purpose.
    pub(crate) fn ensure_running(&mut self) -> Result<()> {
        match self.exited() {
            Some(status) if !self.stopped => {
                Err(self.error(format!("exited unexpectedly ({status})")))
            }
            _ => Ok(()),
        }
    }

    /// Sends `SIGTERM` and marks the process stopped on purpose, unless it has exited (a
    /// crash stays a crash).
    ///
    /// Returns whether the process was still running.
    pub(crate) fn terminate(&mut self) -> bool {
        if self.exited().is_some() {
            return false;
        }
        self.stopped = true;
        if let Some(pid) = Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process(pid, Signal::TERM);
        }
        true
    }

    /// Sends `SIGKILL`, reaps the process and marks it stopped on purpose, unless it has
    /// exited (a crash stays a crash).
    pub(crate) fn kill(&mut self) {
        if self.exited().is_some() {
            return;
        }
        self.stopped = true;
        let _ = self.child.kill();
        self.exit = self.child.wait().ok();
    }

    /// Sends `SIGTERM`, waits up to `grace` for the exit, then sends `SIGKILL` and reaps.
    pub(crate) fn stop(&mut self, grace: Duration) {
        if !self.terminate() {
            return;
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if self.exited().is_some() {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        self.warn_unstopped(grace);
        self.kill();
    }

    /// Logs that the process outlived its grace period after `SIGTERM`.
    pub(crate) fn warn_unstopped(&self, grace: Duration) {
        tracing::warn!(
            component = self.name,
            ?grace,
            "did not stop after SIGTERM; killing it"
        );
    }
}

/// The last `lines` lines of a log file, read from its end so a large log costs nothing.
pub(crate) fn tail(path: &Path, lines: usize) -> String {
    const MAX_BYTES: u64 = 64 * 1024;
    let read = || -> io::Result<String> {
        let mut file = File::open(path)?;
        let len = file.metadata()?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(MAX_BYTES)))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    match read() {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            let tail = all[all.len().saturating_sub(lines)..].join("\n");
            if tail.is_empty() {
                "(empty)".into()
            } else {
                tail
            }
        }
        Err(e) => format!("(cannot read it: {e})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_last_lines() {
        let dir = std::env::temp_dir().join(format!("testenv-tail-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("log");
        let text: String = (1..=100).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&log, text).unwrap();
        assert_eq!(tail(&log, 2), "line 99\nline 100");
        assert_eq!(
            tail(&dir.join("missing"), 2).split(':').next(),
            Some("(cannot read it")
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn children_stop_on_sigterm() {
        let mut cmd = Command::new("sleep");
        cmd.arg("600");
        let log = std::env::temp_dir().join(format!("testenv-sleep-{}.log", std::process::id()));
        let mut c = Component::start("sleep", cmd, log.clone()).unwrap();
        assert!(c.ensure_running().is_ok());
        c.stop(Duration::from_secs(5));
        assert!(c.exited().is_some());
        assert!(c.ensure_running().is_ok(), "a stop counted as a crash");
        std::fs::remove_file(log).unwrap();
    }

    #[test]
    fn an_exit_not_asked_for_is_a_crash() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "exit 3"]);
        let log = std::env::temp_dir().join(format!("testenv-crash-{}.log", std::process::id()));
        let mut c = Component::start("crasher", cmd, log.clone()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while c.exited().is_none() {
            assert!(Instant::now() < deadline, "sh -c 'exit 3' did not exit");
            thread::sleep(Duration::from_millis(20));
        }
        let err = c.ensure_running().unwrap_err().to_string();
        assert!(err.starts_with("crasher exited unexpectedly"), "{err}");
        // Stopping it afterwards does not turn the crash into a stop.
        assert!(!c.terminate());
        c.kill();
        assert!(c.ensure_running().is_err());
        // But it may be started again.
        c.restart().unwrap();
        std::fs::remove_file(log).unwrap();
    }

    #[test]
    fn restart_reuses_the_command_and_appends_to_the_log() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo \"started $GREETING\"; exec sleep 600"])
            .env("GREETING", "hello")
            .env_remove("KUBECONFIG");
        let log = std::env::temp_dir().join(format!("testenv-restart-{}.log", std::process::id()));
        let mut c = Component::start("sleeper", cmd, log.clone()).unwrap();
        let first = c.pid();
        assert!(c.restart().is_err(), "restarted while running");
        let logged = |lines: usize| {
            let deadline = Instant::now() + Duration::from_secs(5);
            while std::fs::read_to_string(&log).unwrap().lines().count() < lines {
                assert!(Instant::now() < deadline, "no line {lines} in the log");
                thread::sleep(Duration::from_millis(20));
            }
        };
        logged(1);

        c.kill();
        assert!(c.is_stopped());
        assert!(
            c.ensure_running().is_ok(),
            "a kill on purpose counted as a crash"
        );
        c.restart().unwrap();
        assert!(!c.is_stopped());
        assert_ne!(c.pid(), first);
        logged(2);
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            "started hello\nstarted hello\n"
        );

        c.stop(Duration::from_secs(5));
        assert!(c.exited().is_some() && c.ensure_running().is_ok());
        std::fs::remove_file(log).unwrap();
    }
}
