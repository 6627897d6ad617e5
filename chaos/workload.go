package chaos

// ciConfig is the pipeline every chaos run pushes: needs, artifacts
// between jobs, cache, a parallel job, a flaky job retried on its script
// failure, a manual job, and retries on the failures a fault causes. Every
// job records that it ran (one file per start, in $CHAOS_DIR/ran) and
// prints numbered lines whose order the checks verify. A job that finds
// its dependency's artifact missing or wrong exits 42.
const ciConfig = `stages: [build, test, deploy]

variables:
  LINES: "10"
  SLEEP: "0"
  GET_SOURCES_ATTEMPTS: "3"
  ARTIFACT_DOWNLOAD_ATTEMPTS: "3"
  RESTORE_CACHE_ATTEMPTS: "3"

default:
  retry:
    max: 2
    when: [runner_system_failure, stuck_or_timeout_failure, unknown_failure, api_failure, data_integrity_failure, scheduler_failure]

.record: &record
  - touch "$CHAOS_DIR/ran/$CI_JOB_ID.$$.$RANDOM"
  - i=1; while [ $i -le "$LINES" ]; do echo "chaos-line $CI_JOB_ID $i"; i=$((i+1)); done

build:
  stage: build
  script:
    - *record
    - mkdir -p out cache
    - echo "built-$CI_PIPELINE_ID" > out/a.txt
    - echo "$CI_JOB_ID" >> cache/builds.txt
    - sleep "$SLEEP"
  artifacts:
    paths: [out/]
  cache:
    key: chaos
    paths: [cache/]

test:
  stage: test
  needs: [build]
  parallel: 2
  script:
    - *record
    - test "$(cat out/a.txt 2>/dev/null)" = "built-$CI_PIPELINE_ID" || { echo ARTIFACT-MISMATCH; exit 42; }
    - sleep "$SLEEP"

flaky:
  stage: test
  needs: []
  retry:
    max: 2
    when: [script_failure, runner_system_failure, stuck_or_timeout_failure, unknown_failure, api_failure]
  script:
    - *record
    - if mkdir "$CHAOS_DIR/flaky/$CI_PIPELINE_ID" 2>/dev/null; then echo "first attempt fails"; exit 1; fi

manual:
  stage: test
  needs: []
  when: manual
  allow_failure: true
  script:
    - *record

deploy:
  stage: deploy
  needs: [build, test]
  script:
    - *record
    - test "$(cat out/a.txt 2>/dev/null)" = "built-$CI_PIPELINE_ID" || { echo ARTIFACT-MISMATCH; exit 42; }
`

// jobsPerPipeline is how many jobs ciConfig creates (manual included).
const jobsPerPipeline = 6

// artifactLostExit is the exit code of a job that found its dependency's
// artifact missing or wrong.
const artifactLostExit = 42
