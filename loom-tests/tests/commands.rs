//! The commands other threads hand the IO thread, and the callers that wait on them: loom
//! models of `cohort::internals::handoff::{Commands, Completion}` with the code that ships.
//!
//! A caller (`Node::remove_peer`, `sync_journal`, the barrier of `add_peer`) makes a
//! `Completion`, hands its command over (`IoShared::command` → `Commands::send`: pushed and
//! the doorbell rung, or abandoned at once if the IO thread has stopped) and waits on it.
//! The IO thread takes the commands after a wake-up (`handle_requests` → `Commands::take`)
//! and completes each once done; as it stops (`DoneGuard`, whether it finished or
//! panicked) it closes the queue (`Commands::stop`), abandoning what no turn took.
//!
//! Checked in every execution: each caller's wait returns (a caller left waiting is a
//! deadlock loom reports), with `Done` for a command a turn took and `Abandoned` for one the
//! stop handed back or the push refused; each completion is settled exactly once (a second
//! `complete` or `abandon` returns `false`, which fails the model); every command is
//! accounted for by exactly one of the three.
#![cfg(loom)]

use cohort::internals::handoff::{Abandon, Commands, Completion, Handoff, Outcome};
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;
use loom_tests::ModelWaker;
use std::sync::Arc;

/// A command its caller waits on, and a count of how its completions were settled.
struct Cmd {
    done: Arc<Completion>,
    abandoned: Arc<AtomicUsize>,
}

impl Abandon for Cmd {
    fn abandon(self) {
        assert!(self.done.abandon(), "a completion settled twice");
        // Relaxed: read after every thread is joined.
        self.abandoned.fetch_add(1, Ordering::Relaxed);
    }
}

/// `callers` threads each hand over one command and wait on it; the IO thread (the main
/// thread) runs `turns` turns without blocking (each takes the commands if a wake-up is
/// pending, and completes them), then stops.
fn model(callers: usize, turns: usize) {
    let waker = ModelWaker::new();
    let handoff = Arc::new(Handoff::new(waker.waker()));
    let commands = Arc::new(Commands::<Cmd>::new());
    let abandoned = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..callers)
        .map(|_| {
            let (handoff, commands, abandoned) =
                (handoff.clone(), commands.clone(), abandoned.clone());
            thread::spawn(move || {
                let done = Arc::new(Completion::default());
                commands.send(
                    Cmd {
                        done: done.clone(),
                        abandoned,
                    },
                    &handoff,
                );
                let outcome = done.wait_until(None);
                assert_ne!(outcome, Outcome::Pending, "woken before settled");
                outcome
            })
        })
        .collect();

    let mut completed = 0;
    for _ in 0..turns {
        if handoff.take_wake() {
            for c in commands.take() {
                assert!(c.done.complete(), "a completion settled twice");
                completed += 1;
            }
        }
    }
    commands.stop();

    let outcomes: Vec<Outcome> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let done = outcomes.iter().filter(|&&o| o == Outcome::Done).count();
    let abandoned = abandoned.load(Ordering::Relaxed);
    assert_eq!(done, completed, "{outcomes:?}");
    assert_eq!(
        completed + abandoned,
        callers,
        "every command done or abandoned exactly once: {outcomes:?}"
    );
    assert!(commands.take().is_empty(), "a command left queued");
}

/// Two callers race one turn of the IO thread and its stop: each command is taken by the
/// turn, handed back by the stop, or refused at its push after the stop.
#[test]
fn two_callers_race_a_turn_and_the_stop() {
    loom_tests::model("commands/two_callers_race_a_turn_and_the_stop", || {
        model(2, 1);
    });
}

/// One caller races two turns and the stop.
#[test]
fn one_caller_races_two_turns_and_the_stop() {
    loom_tests::model("commands/one_caller_races_two_turns_and_the_stop", || {
        model(1, 2);
    });
}
