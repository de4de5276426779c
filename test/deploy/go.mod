module github.com/steward-trustd/steward-trustd/test/deploy

go 1.26.8
