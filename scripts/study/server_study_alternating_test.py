#!/usr/bin/python3
"""Tests of the server study's alternating sets (server_study_alternating.py): the order of the
rounds, the medians over rounds, the pairing of evr with the poll mode, the goals, and tables that
come out the same from the JSON. Run by ctest (server_study_alternating); no server, no GPU."""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_harness as harness  # noqa: E402
import server_study_alternating as alt  # noqa: E402
from server_study_points import BUSY200, BUSY1000, HEALTHZ, MLP  # noqa: E402


def point(server, rnd, rps, cores, p99_us=1000.0, route=BUSY1000, connections=256,
          reactor=0.0, errors=0):
    """A measured point as server-study.py records it (the fields the medians read)."""
    words = server.split()
    threads = int(words[1][2:])
    requests = rps * 2
    by_thread = {"io": cores - reactor - 0.1, "reactor": reactor, "cuda": 0.05, "conn": 0.02,
                 "other": 0.02, "exited": 0.01}
    return {"server": server, "mode": words[0], "threads": threads, "route": route,
            "connections": connections, "gpus": 1, "busy_signal": "stream-waits" not in words,
            "round": rnd, "rps": rps, "requests": requests, "p50_us": p99_us / 2,
            "p99_us": p99_us, "server_cores": cores, "errors": errors,
            "cpu_us_per_request": cores * 2 / requests * 1e6,
            "cores_by_thread": by_thread,
            "cpu_us_per_request_by_thread": {k: v * 2 / requests * 1e6
                                             for k, v in by_thread.items()}}


def rounds_of(server, figures, **kw):
    """Points of one server over rounds 1.. from [(rps, cores)]."""
    return [point(server, i + 1, rps, cores, **kw) for i, (rps, cores) in enumerate(figures)]


class schedule_test(unittest.TestCase):
    def test_every_round_has_every_server_and_even_rounds_run_backwards(self):
        steps = alt.schedule(alt.ORDER, 4, [256, 1024])
        for rnd in range(1, 5):
            labels = [label for r, label, _ in steps if r == rnd]
            self.assertEqual(labels, alt.ORDER if rnd % 2 else alt.ORDER[::-1])

    def test_healthz_at_the_first_count_only_and_not_for_stream_waits(self):
        steps = {label: points for r, label, points in alt.schedule(alt.ORDER, 3, [256, 1024])}
        self.assertIn((HEALTHZ, [256]), steps["evr N=1"])
        self.assertIn((BUSY200, [256, 1024]), steps["poll N=2"])
        self.assertNotIn(HEALTHZ, [route for route, _ in steps["evr N=1 stream-waits"]])

    def test_routes_narrow_the_points_and_drop_servers_left_with_none(self):
        steps = alt.schedule(alt.ORDER, 3, [32], routes=[HEALTHZ])
        self.assertEqual({label for _, label, _ in steps}, set(alt.ORDER[:4]))
        self.assertTrue(all(points == [(HEALTHZ, [32])] for _, _, points in steps))

    def test_mlp_only_when_the_routes_name_it(self):
        named = {label: points for _, label, points in
                 alt.schedule(["evr N=2", "poll N=2"], 3, [256], routes=[MLP])}
        self.assertEqual(named["evr N=2"], [(MLP, [256])])
        default = {label: points for _, label, points in alt.schedule(["evr N=2"], 3, [256])}
        self.assertNotIn(MLP, [route for route, _ in default["evr N=2"]])

    def test_fewer_than_three_rounds_is_refused_with_the_option_named(self):
        with self.assertRaisesRegex(ValueError, "--rounds must be at least 3 .*, not 2"):
            alt.schedule(alt.ORDER, 2, [256])

    def test_rival_is_the_poll_mode_at_the_same_n_and_gpus(self):
        self.assertEqual(alt.rival("evr N=2"), "poll N=2")
        self.assertEqual(alt.rival("evr N=1 stream-waits"), "poll N=1")
        self.assertEqual(alt.rival("evr N=4 @0,1"), "poll N=4 @0,1")
        # A server's own hardware queues (q=8) are its rival's too.
        self.assertEqual(alt.rival("evr N=1 q=8 stream-waits"), "poll N=1 q=8")

    def test_a_label_names_its_hardware_queues(self):
        spec = harness.parse_server("evr N=1 q=8 stream-waits")
        self.assertEqual((spec["queues"], spec["threads"], spec["busy_signal"]), (8, 1, False))
        self.assertIsNone(harness.parse_server("poll N=1")["queues"])
        args = harness.server_args(spec, "cuda", 0, 32, None)
        self.assertEqual(args[args.index("--cuda-connections") + 1], "8")  # the label wins
        with self.assertRaises(ValueError):
            harness.parse_server("poll N=1 q=64")
        self.assertEqual(alt.n_text({"server": "evr N=1 q=8 stream-waits", "threads": 1}), "1, q=8")
        self.assertEqual(alt.n_text({"server": "evr N=2 @0", "threads": 2}), "2")


    def test_a_busy_graph_label_keeps_its_graph_in_the_rival_and_the_arguments(self):
        spec = harness.parse_server("evr N=1 stream-waits busy-graph")
        self.assertEqual((spec["busy_graph"], spec["busy_signal"]), (True, False))
        self.assertEqual(harness.parse_server("evr N=1 busy-graph stream-waits"), {
            **spec, "label": "evr N=1 busy-graph stream-waits"})  # the words in any order
        args = harness.server_args(spec, "cuda", 0, 32, None)
        self.assertIn("--busy-graph", args)
        self.assertIn("--no-busy-signal", args)
        self.assertNotIn("--busy-graph", harness.server_args(harness.parse_server("evr N=1"), "cuda",
                                                             0, 32, None))
        self.assertEqual(alt.rival("evr N=2 busy-graph"), "poll N=2 busy-graph")

    def test_a_kernel_fences_label_passes_the_flag_and_keeps_the_plain_rival(self):
        kf = harness.parse_server("evr N=1 stream-waits kernel-fences")
        self.assertTrue(kf["kernel_fences"])
        self.assertIn("--kernel-fences", harness.server_args(kf, "cuda", 0, 32, None))
        self.assertNotIn("--kernel-fences", harness.server_args(harness.parse_server("evr N=1"),
                                                                "cuda", 0, 32, None))
        self.assertEqual(alt.rival("evr N=1 stream-waits kernel-fences"), "poll N=1")
        with self.assertRaises(ValueError):
            harness.parse_server("poll N=1 kernel-fences")  # an option of evr's alone
        # Stream waits serve no /healthz, wherever the word stands.
        routes = [r for r, _ in alt.server_points("evr N=1 stream-waits busy-graph", [256])]
        self.assertNotIn(HEALTHZ, routes)


class medians_test(unittest.TestCase):
    def test_medians_over_clean_rounds_only(self):
        pts = rounds_of("evr N=1", [(300, 1.0), (100, 1.0), (200, 2.0)])
        pts.append(point("evr N=1", 4, 10_000, 1.0, errors=3))  # not clean: left out
        (row,) = alt.medians(pts)
        self.assertEqual((row["rounds"], row["rounds_failed"]), (3, 1))
        self.assertEqual(row["rps"], 200)
        self.assertEqual(row["server_cores"], 1.0)
        self.assertEqual(row["per_core"], 100)  # per round: 300, 100, 100

    def test_groups_fold_the_rest_and_keep_the_reactor(self):
        (row,) = alt.medians(rounds_of("evr N=1", [(100, 1.0)] * 3, reactor=0.25))
        self.assertAlmostEqual(row["cores_by_group"]["reactor"], 0.25)
        self.assertAlmostEqual(row["cores_by_group"]["rest"], 0.05)  # conn + other + exited
        self.assertAlmostEqual(row["us_per_request_by_group"]["reactor"], 0.25 * 2 / 200 * 1e6)

    def test_skipped_rounds_are_counted_not_measured(self):
        pts = rounds_of("poll N=1", [(100, 1.0)] * 3)
        pts.append({"server": "poll N=1", "mode": "poll", "route": BUSY1000, "connections": 256,
                    "round": 4, "skipped": "budget"})
        (row,) = alt.medians(pts)
        self.assertEqual((row["rounds"], row["rounds_skipped"]), (3, 1))

    def test_round_ratios_pair_evr_and_poll_of_the_same_round(self):
        pts = rounds_of("evr N=1", [(200, 1.0), (300, 1.0), (100, 1.0)]) + \
            rounds_of("poll N=1", [(100, 1.0), (100, 1.0), (100, 2.0)])
        evr = alt.find(alt.medians(pts), "evr N=1", BUSY1000, 256)
        self.assertEqual(alt.round_ratios(pts, evr), [2.0, 3.0, 2.0])


def goal_rows(evr, poll, evr_p99=1000.0, poll_p99=1000.0, reactor=0.0):
    pts = rounds_of("evr N=1", [(evr, 1.0)] * 3, p99_us=evr_p99, reactor=reactor) + \
        rounds_of("poll N=1", [(poll, 1.0)] * 3, p99_us=poll_p99)
    return alt.goals(alt.medians(pts))


class goals_test(unittest.TestCase):
    def test_per_core_goal_met_at_1_2x_with_p99_no_worse(self):
        per_core, reactor = goal_rows(120, 100)
        self.assertTrue(per_core["met"])
        self.assertTrue(reactor["met"])

    def test_per_core_goal_missed_below_1_2x_says_by_how_much(self):
        per_core, _ = goal_rows(119, 100)
        self.assertFalse(per_core["met"])
        self.assertEqual(per_core["why"], "1.19 < 1.2")

    def test_per_core_goal_missed_when_p99_is_worse(self):
        per_core, _ = goal_rows(200, 100, evr_p99=2000.0, poll_p99=1000.0)
        self.assertFalse(per_core["met"])
        self.assertEqual(per_core["why"], "p99 2.00 > 1.00 ms")

    def test_reactor_goal_missed_above_0_05_core(self):
        _, reactor = goal_rows(200, 100, reactor=0.06)
        self.assertFalse(reactor["met"])
        self.assertEqual(reactor["why"], "0.060 > 0.05")

    def test_without_the_poll_mode_the_goal_is_not_measured(self):
        rows = alt.medians(rounds_of("evr N=1", [(100, 1.0)] * 3))
        per_core, _ = alt.goals(rows)
        self.assertIsNone(per_core["met"])

    def test_stream_waits_are_held_to_1_0x_the_poll_mode(self):
        pts = rounds_of("evr N=1 stream-waits", [(99, 1.0)] * 3) + \
            rounds_of("poll N=1", [(100, 1.0)] * 3)
        (goal,) = alt.goals(alt.medians(pts))
        self.assertIn("stream waits", goal["goal"])
        self.assertFalse(goal["met"])
        self.assertEqual(goal["why"], "0.99 < 1.0")


class interval_test(unittest.TestCase):
    def interval(self, evr, poll):
        pts = rounds_of("evr N=1", evr) + rounds_of("poll N=1", poll)
        (row,) = [r for r in alt.medians(pts) if r["server"] == "evr N=1"]
        return alt.ratio_interval(pts, row)

    def test_without_spread_the_interval_is_the_ratio(self):
        lo, hi = self.interval([(200, 1.0)] * 4, [(100, 1.0)] * 4)
        self.assertAlmostEqual(lo, 2.0)
        self.assertAlmostEqual(hi, 2.0)

    def test_the_interval_holds_the_ratio_of_medians_within_the_extremes(self):
        evr = [(r, 1.0) for r in (150, 180, 200, 210, 260, 190, 170)]
        poll = [(r, 1.0) for r in (100, 120, 90, 110, 105, 95, 130)]
        lo, hi = self.interval(evr, poll)
        self.assertLess(lo, 190 / 105)
        self.assertGreater(hi, 190 / 105)
        self.assertGreaterEqual(lo, 150 / 130)
        self.assertLessEqual(hi, 260 / 90)
        self.assertEqual((lo, hi), self.interval(evr, poll))  # seeded: a table is reproducible

    def test_more_rounds_of_the_same_spread_narrow_the_interval(self):
        evr = [(r, 1.0) for r in (150, 180, 200, 210, 260, 190, 170)]
        poll = [(r, 1.0) for r in (100, 120, 90, 110, 105, 95, 130)]
        lo, hi = self.interval(evr, poll)
        lo4, hi4 = self.interval(evr * 4, poll * 4)
        self.assertLess(hi4 - lo4, hi - lo)

    def test_fewer_than_three_rounds_of_either_mode_give_none(self):
        self.assertIsNone(self.interval([(200, 1.0)] * 2, [(100, 1.0)] * 5))


class tables_test(unittest.TestCase):
    def test_tables_from_the_json_are_the_tables_of_the_run(self):
        pts = []
        for server, figures in (("evr N=1", [(210, 1.1), (190, 1.0), (205, 1.2)]),
                                ("poll N=1", [(150, 1.0), (160, 1.0), (140, 0.9)])):
            pts += rounds_of(server, figures, reactor=0.02)
            pts += rounds_of(server, [(900, 1.0)] * 3, route=HEALTHZ)
        doc = {"meta": {"rounds": 3}, "points": pts}
        text = alt.markdown(doc, "header")
        self.assertEqual(alt.markdown(json.loads(json.dumps(doc)), "header"), text)
        # per core, evr: 191, 190, 171; poll: 150, 160, 156; the rounds' ratios 1.27, 1.19, 1.10
        self.assertIn(f"| {BUSY1000} | 256 | 1 | 205, 1.10 | 150, 1.00 | **1.22** (1.10-1.27; ",
                      text)
        self.assertIn("2 of 2 goals met", text)


if __name__ == "__main__":
    unittest.main()
