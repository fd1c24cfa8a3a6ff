//! Two tiny single-threaded wake-up primitives. Everything here lives on one glommio
//! executor (`!Send`), so `Cell`/`RefCell` are enough and nothing can block.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// A one-waiter notification with a stored permit: `notify` before `wait` is not lost.
/// The waiter re-checks its condition in a loop, so spurious wake-ups are harmless.
#[derive(Default)]
pub(crate) struct Signal {
    flag: Cell<bool>,
    waker: Cell<Option<Waker>>,
}

impl Signal {
    pub(crate) fn notify(&self) {
        self.flag.set(true);
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }

    pub(crate) fn wait(&self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| {
            if self.flag.replace(false) {
                Poll::Ready(())
            } else {
                self.waker.set(Some(cx.waker().clone()));
                Poll::Pending
            }
        })
    }
}

/// A latch many tasks wait on (executor shutdown): once set, every waiter wakes and every
/// later wait returns at once. Waiters deregister on drop, so racing it against a read in
/// a loop does not grow anything.
#[derive(Default)]
pub(crate) struct Latch {
    set: Cell<bool>,
    next_key: Cell<u64>,
    waiters: RefCell<HashMap<u64, Waker>>,
}

impl Latch {
    pub(crate) fn set(&self) {
        self.set.set(true);
        let waiters = std::mem::take(&mut *self.waiters.borrow_mut());
        for (_, w) in waiters {
            w.wake();
        }
    }

    pub(crate) fn wait(&self) -> LatchWait<'_> {
        LatchWait {
            latch: self,
            key: None,
        }
    }
}

pub(crate) struct LatchWait<'a> {
    latch: &'a Latch,
    key: Option<u64>,
}

impl Future for LatchWait<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if this.latch.set.get() {
            return Poll::Ready(());
        }
        let key = *this.key.get_or_insert_with(|| {
            let k = this.latch.next_key.get();
            this.latch.next_key.set(k.wrapping_add(1));
            k
        });
        this.latch
            .waiters
            .borrow_mut()
            .insert(key, cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for LatchWait<'_> {
    fn drop(&mut self) {
        if let Some(k) = self.key {
            self.latch.waiters.borrow_mut().remove(&k);
        }
    }
}
