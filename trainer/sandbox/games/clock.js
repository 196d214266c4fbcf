// The fake clock: injected before a game page's own scripts (Page.addScriptToEvaluateOnNewDocument),
// it replaces every way a page can see time pass with a virtual time that moves only when told:
//   Date (constructor, Date() and Date.now), performance.now, setTimeout / clearTimeout,
//   setInterval / clearInterval, requestAnimationFrame / cancelAnimationFrame, requestIdleCallback,
//   and CSS / Web animations (each one paused, its currentTime set from the virtual clock).
// window.__tandemClock.advance(ms) moves the time forward by ms, running the due timers and the
// animation frames (a fixed 1000/60 ms cadence) in time order; nothing runs between calls, so the
// game is paused while the policy thinks and the same seed and actions give the same frames.
// Delays below 1 ms count as 1 ms, so a timer that re-arms itself with 0 cannot stall advance().
(function () {
  "use strict";
  if (window.__tandemClock) return;
  const RealDate = Date;
  const EPOCH = 1767225600000; // 2026-01-01T00:00:00Z: every page starts at the same date
  const FRAME = 1000 / 60;
  const MAX_CALLBACKS = 200000; // per advance(): beyond this the page is looping, and advance() says so
  let now = 0; // virtual ms since the page started (performance.now())
  let frame = 1; // the next animation frame is at frame * FRAME
  let seq = 0; // ties between timers due at once go in the order they were set
  let nextId = 1;
  const timers = new Map(); // id -> {due, seq, fn, args, every}
  let frameCallbacks = new Map(); // id -> fn
  const errors = [];
  const animStart = new WeakMap(); // Animation -> the virtual time its currentTime 0 was

  function report(e) {
    errors.push(String((e && e.stack) || e));
    if (errors.length > 20) errors.shift();
  }
  // the page's own uncaught exceptions (its event handlers, its scripts, its promises), caught as they
  // happen: DevTools' Runtime.exceptionThrown for them can arrive after the step that caused it
  window.addEventListener("error", (e) => { if (e instanceof ErrorEvent) report(e.error || e.message); });
  window.addEventListener("unhandledrejection", (e) => report(e.reason));

  // -------------------------------------------------- Date
  class FakeDate extends RealDate {
    constructor(...args) {
      if (args.length === 0) super(EPOCH + Math.floor(now));
      else super(...args);
    }
    static now() { return EPOCH + Math.floor(now); }
  }
  const DateProxy = new Proxy(FakeDate, {
    apply() { return new RealDate(EPOCH + Math.floor(now)).toString(); }, // Date() called without new
  });
  window.Date = DateProxy;

  // -------------------------------------------------- performance.now
  Object.defineProperty(window.performance, "now", { value: function () { return now; }, configurable: true, writable: true });

  // -------------------------------------------------- timers
  function addTimer(fn, delay, args, every) {
    const id = nextId++;
    const d = Math.max(1, Number(delay) || 0);
    timers.set(id, { due: now + d, seq: seq++, fn, args, every: every ? d : 0 });
    return id;
  }
  function call(fn, args) {
    try {
      if (typeof fn === "function") fn.apply(window, args);
      else (0, eval)(String(fn)); // setTimeout("code", ...)
    } catch (e) {
      report(e);
    }
  }
  window.setTimeout = function (fn, delay, ...args) { return addTimer(fn, delay, args, false); };
  window.setInterval = function (fn, delay, ...args) { return addTimer(fn, delay, args, true); };
  window.clearTimeout = window.clearInterval = function (id) { timers.delete(id); };
  window.requestAnimationFrame = function (fn) { const id = nextId++; frameCallbacks.set(id, fn); return id; };
  window.cancelAnimationFrame = function (id) { frameCallbacks.delete(id); };
  window.requestIdleCallback = function (fn) {
    return addTimer(() => fn({ didTimeout: false, timeRemaining: () => 50 }), 1, [], false);
  };
  window.cancelIdleCallback = window.clearTimeout;

  // -------------------------------------------------- animations
  function driveAnimations() {
    if (!document.getAnimations) return;
    let list;
    try { list = document.getAnimations(); } catch (e) { return; }
    for (const a of list) {
      try {
        if (!animStart.has(a)) {
          animStart.set(a, now - (Number(a.currentTime) || 0));
          a.pause();
        }
        const rate = a.playbackRate || 1;
        a.currentTime = (now - animStart.get(a)) * rate;
      } catch (e) {
        report(e);
      }
    }
  }

  // -------------------------------------------------- the clock
  function earliestTimer() {
    let best = null;
    for (const [id, t] of timers) {
      if (best === null || t.due < best[1].due || (t.due === best[1].due && t.seq < best[1].seq)) best = [id, t];
    }
    return best;
  }

  function advance(ms) {
    const target = now + Math.max(0, Number(ms) || 0);
    let ran = 0;
    for (;;) {
      const t = earliestTimer();
      const frameAt = frame * FRAME;
      const timerAt = t ? t[1].due : Infinity;
      const at = Math.min(timerAt, frameAt);
      if (at > target + 1e-9) break;
      if (++ran > MAX_CALLBACKS) throw new Error(`the page ran over ${MAX_CALLBACKS} timer callbacks in one advance(${ms}): it loops`);
      now = Math.max(now, at);
      if (timerAt <= frameAt) {
        const [id, timer] = t;
        if (timer.every) {
          timer.due += timer.every;
          timer.seq = seq++;
        } else {
          timers.delete(id);
        }
        call(timer.fn, timer.args);
      } else {
        frame += 1;
        const due = frameCallbacks;
        frameCallbacks = new Map(); // callbacks asked for during this frame wait for the next
        for (const fn of due.values()) call(fn, [now]);
        driveAnimations();
      }
    }
    now = target;
    driveAnimations();
    return ran;
  }

  Object.defineProperty(window, "__tandemClock", {
    value: Object.freeze({
      advance,
      now: () => now,
      frame: FRAME,
      pending: () => ({ timers: timers.size, frames: frameCallbacks.size }),
      errors: () => errors.slice(),
      clearErrors: () => { errors.length = 0; },
    }),
    configurable: false,
    writable: false,
  });
})();
