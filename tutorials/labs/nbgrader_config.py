"""nbgrader's configuration of the nbrpc labs course (this folder is the course directory).

Each lab's notebook starts a real cluster: the notebook's kernel is the RPC driver and
every worker is a kernel process of its own. A worker exits within seconds of its driver,
however the driver ends (shut down at the end of the notebook, interrupted, or killed by
nbgrader), so no worker outlives the kernel that grades a submission.
"""

c = get_config()  # noqa: F821 (nbgrader's config loader provides it)

c.CourseDirectory.course_id = "nbrpc-labs"

# Each cell gets at most this many seconds when a submission is graded; then nbgrader
# interrupts the kernel, records the cell as failed, and goes on with the next. The longest cell of a correct solution takes
# about 15 s on 2 loaded cores.
c.Execute.timeout = 120
# A kernel that ignores the interrupt (student code catching KeyboardInterrupt) sends no
# output after it: go on to the next cell (each then runs into the limit, and the kernel is
# killed at the end) rather than give up on the whole submission, which would go ungraded.
c.Execute.raise_on_iopub_timeout = False
# What a cell stopped at the time limit shows, in the autograded notebook and the feedback.
c.Execute.error_on_timeout = {
    "ename": "CellTimeoutError",
    "evalue": "this cell ran past the time limit and was stopped",
    "traceback": [
        "✗ this cell ran past the time limit and was stopped",
        "    hint: look for a loop that never ends, here or in a function it calls on a worker, "
        "or a wait for something that never comes (a future nobody sets, a call to a worker "
        "that is busy for ever)",
    ],
}

# nbgrader's stub in the students' versions: the test cells name the function that
# still raises it.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
